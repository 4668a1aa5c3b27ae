package quotareplica_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/quota/allocate"

	"github.com/triagehq/triage/internal/testkit/etcdtest"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotareplica"
	"github.com/triagehq/triage/triageyaml"
)

// A policy kept in etcd: every replica's watcher puts a good push in force
// with its revision as the version, refuses a bad one (a value that does
// not validate, one past MaxPolicySize, a deletion) and keeps the last
// good one.
func TestPolicyInEtcdRefusesBadPushes(t *testing.T) {
	t.Parallel() // its own etcd and replicas
	e := etcdtest.Start(t)
	admin := e.Client(t)
	const key = "/triage/quota/policy"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put := func(v string) int64 {
		t.Helper()
		resp, err := admin.Put(ctx, key, v)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	if _, _, err := mustWatcher(t, e, key).Load(ctx); err == nil || !strings.Contains(err.Error(), "no policy") {
		t.Fatalf("Load of a missing key: %v", err)
	}
	rev1 := put("tasks: 3\ncustomers:\n  ads: {cpu: 4}\n")

	type replica struct {
		r        *quotareplica.Replica
		versions chan int64
		refusals chan int64
	}
	var rs []*replica
	for range 3 {
		w := mustWatcher(t, e, key)
		p, rev, err := w.Load(ctx)
		if err != nil || rev != rev1 {
			t.Fatalf("Load: %v at revision %d, want %d", err, rev, rev1)
		}
		r, err := quotareplica.New(e.Client(t), "127.0.0.1:1", p, func(p *quota.Policy, opts ...allocate.Option) (*allocate.Allocator, error) {
			return allocate.New(p, opts...)
		})
		if err != nil {
			t.Fatal(err)
		}
		r.SetPolicy(p, rev)
		rep := &replica{r: r, versions: make(chan int64, 10), refusals: make(chan int64, 10)}
		rs = append(rs, rep)
		go w.Run(ctx, rev, func(p *quota.Policy, v int64) {
			r.SetPolicy(p, v)
			rep.versions <- v
		}, func(v int64, err error) {
			t.Logf("revision %d refused: %v", v, err)
			rep.refusals <- v
		})
	}
	next := func(ch chan int64, what string) int64 {
		t.Helper()
		select {
		case v := <-ch:
			return v
		case <-ctx.Done():
			t.Fatalf("no %s", what)
			return 0
		}
	}
	for _, push := range []string{
		"tasks: 3\ncustomers:\n  ads: {cpu: -4}\n", // does not validate
		"tasks: 3\n" + strings.Repeat("# padding\n", quotareplica.MaxPolicySize/10+1),
		"", // empty: no tasks
	} {
		rev := put(push)
		for i, rep := range rs {
			if got := next(rep.refusals, "refusal"); got != rev {
				t.Errorf("replica %d refused revision %d, want %d", i, got, rev)
			}
			if v := rep.r.PolicyVersion(); v != rev1 {
				t.Errorf("replica %d serves version %d after a bad push, want %d", i, v, rev1)
			}
		}
	}
	if _, err := admin.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	for i, rep := range rs {
		next(rep.refusals, "refusal of the deletion")
		if v := rep.r.PolicyVersion(); v != rev1 {
			t.Errorf("replica %d serves version %d after the key was deleted, want %d", i, v, rev1)
		}
	}
	rev2 := put("tasks: 3\ncustomers:\n  ads: {cpu: 8}\n")
	for i, rep := range rs {
		if got := next(rep.versions, "good policy"); got != rev2 {
			t.Errorf("replica %d put revision %d in force, want %d", i, got, rev2)
		}
		if v := rep.r.PolicyVersion(); v != rev2 {
			t.Errorf("replica %d serves version %d, want %d", i, v, rev2)
		}
	}
}

func mustWatcher(t *testing.T, e *etcdtest.Server, key string) *quotareplica.PolicyWatcher {
	t.Helper()
	w, err := quotareplica.WatchPolicy(e.Client(t), key, triageyaml.ParseQuota)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
