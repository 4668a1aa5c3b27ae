package quotareplica

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/quota"
)

// MaxPolicySize bounds a policy stored in etcd: 1 MiB, as a policy file.
const MaxPolicySize = 1 << 20

// PolicyWatcher keeps the quota policy stored in etcd under one key in
// force, so that every replica of the quota service serves the same
// policy: Load reads it, and Run follows every change. Each value is
// parsed and validated as a whole; a value that does not parse, is larger
// than MaxPolicySize, or a deletion of the key, is refused and the last
// good policy stays in force (as with a policy file; a bad push never
// takes the service down). A policy's version is the etcd revision that
// last modified the key.
//
// The zero value is not usable; call WatchPolicy. Run is its only
// goroutine besides the etcd client's and ends with its context.
type PolicyWatcher struct {
	cli   *clientv3.Client
	key   string
	parse func([]byte) (*quota.Policy, error)
	clk   clock.Clock
}

// WatchPolicy returns a watcher of the policy under key, which parse
// turns into a Policy (triageyaml.ParseQuota for YAML).
func WatchPolicy(cli *clientv3.Client, key string, parse func([]byte) (*quota.Policy, error)) (*PolicyWatcher, error) {
	if cli == nil || key == "" || parse == nil {
		return nil, errors.New("quotareplica: WatchPolicy needs an etcd client, a key and a parser")
	}
	return &PolicyWatcher{cli: cli, key: key, parse: parse, clk: clock.Real()}, nil
}

// Load reads the policy now; a missing key or a bad policy is an error.
func (w *PolicyWatcher) Load(ctx context.Context) (*quota.Policy, int64, error) {
	resp, err := w.cli.Get(ctx, w.key)
	if err != nil {
		return nil, 0, fmt.Errorf("quotareplica: reading policy %s: %w", w.key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, fmt.Errorf("quotareplica: no policy under %s in etcd", w.key)
	}
	kv := resp.Kvs[0]
	p, err := w.check(kv.Value)
	if err != nil {
		return nil, kv.ModRevision, err
	}
	return p, kv.ModRevision, nil
}

func (w *PolicyWatcher) check(b []byte) (*quota.Policy, error) {
	if len(b) > MaxPolicySize {
		return nil, fmt.Errorf("quotareplica: policy %s is %d bytes, over %d", w.key, len(b), MaxPolicySize)
	}
	p, err := w.parse(b)
	if err != nil {
		return nil, fmt.Errorf("quotareplica: policy %s: %w", w.key, err)
	}
	return p, nil
}

// Run follows the key from the revision after since (Load's) until ctx is
// done: apply is called with each good policy and its revision, refused
// with each bad one's revision and why. When the watch breaks (etcd away,
// the revision compacted) Run reads the key again and resumes, pacing its
// retries (250 ms growing to 5 s). It returns ctx's error.
func (w *PolicyWatcher) Run(ctx context.Context, since int64, apply func(*quota.Policy, int64), refused func(int64, error)) error {
	failures := 0
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for resp := range w.cli.Watch(wctx, w.key, clientv3.WithRev(since+1)) {
			if resp.CompactRevision > 0 {
				break // missed changes: read the key again
			}
			if resp.Err() != nil {
				break
			}
			failures = 0
			for _, ev := range resp.Events {
				since = ev.Kv.ModRevision
				if ev.Type == clientv3.EventTypeDelete {
					refused(since, fmt.Errorf("quotareplica: policy %s deleted from etcd", w.key))
					continue
				}
				if p, err := w.check(ev.Kv.Value); err != nil {
					refused(since, err)
				} else {
					apply(p, since)
				}
			}
		}
		cancel()
		if ctx.Err() != nil {
			break
		}
		failures = min(failures+1, 5)
		t := w.clk.NewTimer(min(5*time.Second, 125*time.Millisecond<<failures))
		select {
		case <-ctx.Done():
		case <-t.C():
		}
		t.Stop()
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := w.cli.Get(rctx, w.key)
		rcancel()
		if err != nil || len(resp.Kvs) == 0 || resp.Kvs[0].ModRevision <= since {
			if err == nil {
				since = max(since, resp.Header.Revision)
			}
			continue
		}
		kv := resp.Kvs[0]
		since = kv.ModRevision
		if p, err := w.check(kv.Value); err != nil {
			refused(since, err)
		} else {
			apply(p, since)
		}
	}
	return ctx.Err()
}
