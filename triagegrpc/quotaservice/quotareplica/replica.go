// Package quotareplica runs triage's quota service (quotaservice) as
// replicas of which one, elected through etcd, grants leases (Doorman's
// master election, on the coordination store operators already run), and
// keeps the fleet's quota policy in etcd (WatchPolicy). Tasks reach the
// replicas with quotaservice.Client's WithReplicas.
package quotareplica

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/quota/allocate"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
	"github.com/triagehq/triage/wire"
)

// Replica is one of several quota service processes of which one, the
// leader, grants leases: the replicas campaign in an etcd election
// (go.etcd.io/etcd/client/v3/concurrency), each under an etcd session
// whose lease lasts the session TTL, and the winner serves Refresh from a
// allocate.Allocator it creates when elected, with the policy in force, so
// that it starts in learning mode (tasks report the shares they hold). A follower, or a leader whose
// session is in doubt, refuses Refresh with UNAVAILABLE and, when it knows
// the leader, names it in the trailer wire.QuotaLeaderKey; the Client
// follows the name (quotaservice.WithReplicas).
//
// A leader stops granting once half the TTL has passed since it sent the
// latest renewal of its session's lease that etcd acknowledged (it renews
// every third of the TTL), and steps down
// when the session ends; etcd elects no other replica until that lease has
// expired, and the new leader's Allocator starts in learning mode for a
// lease length, so in pessimistic mode the shares two leaders granted never
// overlap (docs/walkthrough.md, "The quota service's replicas").
//
// The zero value is not usable; call New. A Replica is safe for
// concurrent use. Its goroutines are Run's and the two Run starts (one
// follows the election's leader, one renews the leader's session), besides
// the etcd client's; all have ended when Run returns, with its context.
// Bounded: one Allocator at a time, bounded as allocate.Allocator says.
type Replica struct {
	quotapb.UnimplementedQuotaServer
	cli       *clientv3.Client
	advertise string
	newAlloc  func(*quota.Policy, ...allocate.Option) (*allocate.Allocator, error)
	svcOpts   []quotaservice.ServiceOption
	prefix    string
	ttl       int // seconds
	clk       clock.Clock

	leaderAddr atomic.Pointer[string] // the leader as last observed, nil if none
	elections  atomic.Uint64          // times this replica was elected
	since      func() time.Duration   // monotonic time since the replica was made, on clk
	lastRenew  atomic.Int64           // since() of the latest renewal of its session's lease, in ns, while leader
	mu         sync.Mutex
	policy     *quota.Policy
	version    int64                 // of policy, as SetPolicy was told
	leading    *quotaservice.Service // non-nil while this replica is the leader
	alloc      *allocate.Allocator   // leading's
	// last is the Allocator of this replica's latest term, and lastTerm
	// the value it wrote to the term key: re-elected with no other leader
	// between, the replica takes it up again (see term).
	last     *allocate.Allocator
	lastTerm string
}

// Option configures a Replica.
type Option interface{ apply(*Replica) }

type optionFunc func(*Replica)

func (f optionFunc) apply(r *Replica) { f(r) }

// DefaultElectionPrefix is the etcd key prefix of the election.
const DefaultElectionPrefix = "/triage/quota/leader"

// DefaultSessionTTL is the etcd session's TTL, in seconds: how long a
// leader that died holds the election before another replica takes over.
const DefaultSessionTTL = 5

// WithElectionPrefix sets the etcd key prefix of the election (default
// DefaultElectionPrefix); replicas of one service share it.
func WithElectionPrefix(p string) Option {
	return optionFunc(func(r *Replica) { r.prefix = p })
}

// WithSessionTTL sets the session TTL in seconds (default
// DefaultSessionTTL, at least 2).
func WithSessionTTL(seconds int) Option {
	return optionFunc(func(r *Replica) { r.ttl = seconds })
}

// WithServiceOptions sets the options of the Service the leader serves.
func WithServiceOptions(opts ...quotaservice.ServiceOption) Option {
	return optionFunc(func(r *Replica) { r.svcOpts = opts })
}

// WithClock sets the clock that dates lease renewals (default
// clock.Real()).
func WithClock(clk clock.Clock) Option {
	return optionFunc(func(r *Replica) { r.clk = clk })
}

// New returns a replica that campaigns through cli as advertise (the
// address tasks reach it at, at most 64 bytes) and, when elected, serves
// the Allocator newAlloc makes of the policy in force (p, until SetPolicy);
// newAlloc must pass the options it is given on to allocate.New
// (allocate.WithFreshStart for the first leader the service ever had).
// Register it with quotapb.RegisterQuotaServer and call Run.
func New(cli *clientv3.Client, advertise string, p *quota.Policy, newAlloc func(*quota.Policy, ...allocate.Option) (*allocate.Allocator, error), opts ...Option) (*Replica, error) {
	if cli == nil || p == nil || newAlloc == nil {
		return nil, errors.New("quotareplica: a Replica needs an etcd client, a policy and an Allocator constructor")
	}
	if advertise == "" || len(advertise) > 64 {
		return nil, fmt.Errorf("quotareplica: advertised address %q must be 1 to 64 bytes", advertise)
	}
	r := &Replica{cli: cli, advertise: advertise, policy: p, newAlloc: newAlloc, prefix: DefaultElectionPrefix, ttl: DefaultSessionTTL}
	for _, o := range opts {
		o.apply(r)
	}
	if r.ttl < 2 {
		return nil, fmt.Errorf("quotareplica: session TTL %d s must be at least 2", r.ttl)
	}
	if r.prefix == "" {
		return nil, errors.New("quotareplica: empty election prefix")
	}
	r.clk = clock.OrReal(r.clk)
	r.since = clock.SinceFunc(r.clk, r.clk.Now())
	return r, nil
}

// Leader returns the leader's advertised address as last observed, and
// whether there is one.
func (r *Replica) Leader() (string, bool) {
	if p := r.leaderAddr.Load(); p != nil {
		return *p, true
	}
	return "", false
}

// IsLeader reports whether this replica grants leases now.
func (r *Replica) IsLeader() bool { return r.granting() != nil }

// Elections returns how many times this replica has been elected.
func (r *Replica) Elections() uint64 { return r.elections.Load() }

// SetPolicy puts p in force: in the leader's Allocator now, and in the
// Allocator of any later term. version is what PolicyVersion reports (the
// etcd revision of the policy's key with WatchPolicy).
func (r *Replica) SetPolicy(p *quota.Policy, version int64) {
	if p == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.policy, r.version = p, version
	if r.alloc != nil {
		r.alloc.SetPolicy(p)
	}
	if r.last != nil && r.last != r.alloc {
		r.last.SetPolicy(p)
	}
}

// PolicyVersion returns the version given with the policy in force (0
// for the policy given to New).
func (r *Replica) PolicyVersion() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.version
}

// Allocator returns the leader's Allocator while this replica leads, else
// nil (for metrics).
func (r *Replica) Allocator() *allocate.Allocator {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.alloc
}

// granting returns the leader's Service while its session is certain.
func (r *Replica) granting() *quotaservice.Service {
	r.mu.Lock()
	svc := r.leading
	r.mu.Unlock()
	if svc == nil {
		return nil
	}
	// Monotonic: a wall clock stepped back while the leader is cut off
	// from etcd must not make an expired lease look fresh.
	if int64(r.since())-r.lastRenew.Load() > int64(r.ttl)*int64(time.Second)/2 {
		return nil // in doubt: etcd may be about to let the lease expire
	}
	return svc
}

// Refresh implements quotapb.QuotaServer: the leader's Allocator answers;
// any other replica refuses with UNAVAILABLE, naming the leader.
func (r *Replica) Refresh(ctx context.Context, req *quotapb.RefreshRequest) (*quotapb.RefreshResponse, error) {
	if svc := r.granting(); svc != nil {
		return svc.Refresh(ctx, req)
	}
	if addr, ok := r.Leader(); ok && addr != r.advertise {
		grpc.SetTrailer(ctx, metadata.Pairs(wire.QuotaLeaderKey, addr))
		return nil, status.Errorf(codes.Unavailable, "quotareplica: not the leader; ask %s", addr)
	}
	return nil, status.Error(codes.Unavailable, "quotareplica: no leader with a certain session here")
}

// Run campaigns, leads while elected and campaigns again when it loses the
// lead, until ctx is done; then it resigns, so that another replica takes
// over at once, and returns ctx's error.
func (r *Replica) Run(ctx context.Context) error {
	observed := make(chan struct{})
	go func() { defer close(observed); r.observe(ctx) }()
	defer func() { <-observed }()
	failures := 0
	for ctx.Err() == nil {
		err := r.term(ctx)
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			failures = min(failures+1, 6)
		} else {
			failures = 0
		}
		t := r.clk.NewTimer(time.Duration(failures) * 250 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C():
		}
		t.Stop()
	}
	return ctx.Err()
}

// term is one session: campaign, then lead until the session ends or ctx
// is done.
func (r *Replica) term(ctx context.Context) error {
	s, err := concurrency.NewSession(r.cli, concurrency.WithTTL(r.ttl), concurrency.WithContext(ctx))
	if err != nil {
		return err
	}
	// s.Close (deferred below) revokes the lease: the election's key goes
	// at once. The session's own keep-alive does not say when the lease
	// was last renewed; renew does, dating each renewal by when it was
	// sent (etcd extends the lease no earlier than that).
	r.lastRenew.Store(int64(r.since()))
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		r.renew(s)
	}()
	defer func() { s.Close(); <-stopped }()
	e := concurrency.NewElection(s, r.prefix)
	if err := e.Campaign(s.Ctx(), r.advertise); err != nil {
		return err
	}
	prev, term, err := r.claimTerm(s.Ctx(), e)
	if err != nil {
		return err
	}
	r.mu.Lock()
	var alloc *allocate.Allocator
	switch {
	case prev == nil:
		// No leader ever wrote the term key: no grant of another
		// Allocator can be in force.
		alloc, err = r.newAlloc(r.policy, allocate.WithFreshStart())
	case r.last != nil && *prev == r.lastTerm:
		// This replica led last, and no one since: its Allocator holds
		// every grant that can still be in force.
		alloc = r.last
	default:
		alloc, err = r.newAlloc(r.policy)
	}
	if err == nil {
		r.alloc, r.leading = alloc, quotaservice.NewService(alloc, r.svcOpts...)
		r.last, r.lastTerm = alloc, term
	}
	r.mu.Unlock()
	if err != nil {
		return err
	}
	r.elections.Add(1)
	defer func() {
		r.mu.Lock()
		r.leading, r.alloc = nil, nil
		r.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		e.Resign(rctx)
		cancel()
	}()
	select {
	case <-ctx.Done():
		return nil
	case <-s.Done():
		return errors.New("quotareplica: the etcd session ended")
	case <-stopped:
		return errors.New("quotareplica: the etcd lease is gone")
	}
}

// claimTerm writes this term to the term key (the election prefix plus
// "-term", outside the election's keys), if this replica still leads, and
// returns the value it held before (nil if none) and the one written. A
// leader grants only after it, so the term key names the latest leader
// that may have granted.
func (r *Replica) claimTerm(ctx context.Context, e *concurrency.Election) (prev *string, term string, err error) {
	term = r.advertise + " " + strconv.FormatInt(e.Rev(), 10)
	key := r.prefix + "-term"
	tctx, cancel := context.WithTimeout(ctx, time.Duration(r.ttl)*time.Second/2)
	defer cancel()
	resp, err := r.cli.Txn(tctx).If(clientv3.Compare(clientv3.CreateRevision(e.Key()), "=", e.Rev())).
		Then(clientv3.OpGet(key), clientv3.OpPut(key, term)).Commit()
	if err != nil {
		return nil, "", err
	}
	if !resp.Succeeded {
		return nil, "", errors.New("quotareplica: no longer the leader")
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		v := string(kvs[0].Value)
		prev = &v
	}
	return prev, term, nil
}

// renew renews s's lease every sixth of the TTL, counted from when the
// last renewal was sent (not from its answer, so that a slow round trip
// does not push the next one out), and records in lastRenew when each
// renewal that etcd acknowledged was sent, until the session ends or etcd
// says the lease is gone. A leader grants while its last acknowledged
// renewal was sent less than TTL/2 ago: through round trips up to about
// TTL/3.
func (r *Replica) renew(s *concurrency.Session) {
	every := time.Duration(r.ttl) * time.Second / 6
	next := r.since() + every
	for {
		t := r.clk.NewTimer(max(next-r.since(), 0))
		select {
		case <-s.Done():
			t.Stop()
			return
		case <-t.C():
		}
		sent := r.since()
		next = sent + every
		ctx, cancel := context.WithTimeout(s.Ctx(), time.Duration(r.ttl)*time.Second/2)
		_, err := r.cli.KeepAliveOnce(ctx, s.Lease())
		cancel()
		switch {
		case err == nil:
			r.lastRenew.Store(int64(sent))
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			return
		}
	}
}

// observe follows the election's leader until ctx is done.
func (r *Replica) observe(ctx context.Context) {
	for ctx.Err() == nil {
		s, err := concurrency.NewSession(r.cli, concurrency.WithTTL(r.ttl), concurrency.WithContext(ctx))
		if err != nil {
			t := r.clk.NewTimer(500 * time.Millisecond)
			select {
			case <-ctx.Done():
			case <-t.C():
			}
			t.Stop()
			continue
		}
		for resp := range concurrency.NewElection(s, r.prefix).Observe(s.Ctx()) {
			if len(resp.Kvs) > 0 {
				addr := string(resp.Kvs[0].Value)
				r.leaderAddr.Store(&addr)
			}
		}
		s.Close()
		// The observation ended (etcd unreachable, the session lost): the
		// leader it named may be gone, so followers stop sending tasks
		// there, and the next try waits rather than spinning against etcd.
		r.leaderAddr.Store(nil)
		t := r.clk.NewTimer(500 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C():
		}
		t.Stop()
	}
}
