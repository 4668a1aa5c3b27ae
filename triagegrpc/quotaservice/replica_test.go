package quotaservice_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/internal/etcdtest"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
	"github.com/triagehq/triage/wire"
)

// replicaProc is one replica with its own etcd client, through a proxy,
// and its own gRPC server, so that a test can crash it: the proxy cuts it
// off etcd at once (it cannot resign), and its lease expires after the
// session TTL, as after a SIGKILL.
type replicaProc struct {
	addr   string
	r      *quotaservice.Replica
	proxy  *etcdtest.Proxy
	gs     *grpc.Server
	cancel context.CancelFunc
	done   chan struct{}
}

func (p *replicaProc) crash() {
	p.proxy.Cut()
	p.cancel()
	p.gs.Stop()
	<-p.done
}

func startReplica(t *testing.T, e *etcdtest.Server, ttl int, lease time.Duration) *replicaProc {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	policy, err := quota.New(quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 4}}, Tasks: 2})
	if err != nil {
		t.Fatal(err)
	}
	proxy := e.NewProxy(t)
	r, err := quotaservice.NewReplica(proxy.Client(t), lis.Addr().String(), func() (*quota.Allocator, error) {
		return quota.NewAllocator(policy, quota.WithLease(lease), quota.WithRefresh(lease/4))
	}, quotaservice.WithSessionTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(quotaservice.ServerOptions()...)
	quotapb.RegisterQuotaServer(gs, r)
	go gs.Serve(lis)
	ctx, cancel := context.WithCancel(context.Background())
	p := &replicaProc{addr: lis.Addr().String(), r: r, proxy: proxy, gs: gs, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(p.done); r.Run(ctx) }()
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			cancel()
			gs.Stop()
			<-p.done
		})
	})
	return p
}

// waitFor polls cond until it holds or the deadline passes: the election
// runs on etcd's real clock.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		<-tick.C
	}
	return time.Since(start)
}

func leaders(ps []*replicaProc) []*replicaProc {
	var out []*replicaProc
	for _, p := range ps {
		if p.r.IsLeader() {
			out = append(out, p)
		}
	}
	return out
}

// Three replicas on a real etcd elect one leader; the others refuse and
// name it; a task's client follows the name; when the leader crashes
// another is elected once its session's lease expires, and the client
// leases from it.
func TestReplicasElectOneLeaderAndFailOver(t *testing.T) {
	e := etcdtest.Start(t)
	const ttl = 2
	var ps []*replicaProc
	for range 3 {
		ps = append(ps, startReplica(t, e, ttl, 2*time.Second))
	}
	waitFor(t, 10*time.Second, "a leader", func() bool { return len(leaders(ps)) == 1 })
	leader := leaders(ps)[0]
	waitFor(t, 5*time.Second, "every replica knowing the leader", func() bool {
		for _, p := range ps {
			if a, ok := p.r.Leader(); !ok || a != leader.addr {
				return false
			}
		}
		return true
	})
	conns := map[string]grpc.ClientConnInterface{}
	for _, p := range ps {
		cc, err := grpc.NewClient(p.addr, append(quotaservice.DialOptions(time.Second), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		conns[p.addr] = cc
	}
	// A follower refuses, naming the leader.
	for _, p := range ps {
		if p == leader {
			continue
		}
		var trailer metadata.MD
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := quotapb.NewQuotaClient(conns[p.addr]).Refresh(ctx, &quotapb.RefreshRequest{Task: "task-1"}, grpc.Trailer(&trailer))
		cancel()
		if status.Code(err) != codes.Unavailable || len(trailer.Get(wire.QuotaLeaderKey)) != 1 || trailer.Get(wire.QuotaLeaderKey)[0] != leader.addr {
			t.Errorf("follower %s: %v, trailer %v; want UNAVAILABLE naming %s", p.addr, err, trailer, leader.addr)
		}
	}
	usage, _ := quota.NewUsage()
	leased := quota.NewLeased(nil, nil)
	qc, err := quotaservice.NewClient(nil, "task-1", usage, leased, quotaservice.WithReplicas(conns))
	if err != nil {
		t.Fatal(err)
	}
	refresh := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return qc.RefreshOnce(ctx)
	}
	if err := refresh(); err != nil {
		t.Fatalf("refresh through the replicas: %v", err)
	}
	if _, ok := leased.Current(); !ok {
		t.Fatal("no lease after a refresh")
	}
	before := leader.r.Elections()
	leader.crash()
	crashed := time.Now()
	var rest []*replicaProc
	for _, p := range ps {
		if p != leader {
			rest = append(rest, p)
		}
	}
	elected := waitFor(t, time.Duration(ttl)*time.Second+5*time.Second, "a new leader", func() bool { return len(leaders(rest)) == 1 })
	if before != 1 {
		t.Errorf("the first leader was elected %d times, want 1", before)
	}
	if err := refresh(); err != nil {
		t.Fatalf("refresh after the failover: %v", err)
	}
	t.Logf("a new leader %v after the crash (session TTL %d s); a lease from it %v after the crash", elected, ttl, time.Since(crashed))
	if elected < time.Second {
		t.Errorf("a new leader %v after the crash, before the dead leader's lease (TTL %d s) could expire", elected, ttl)
	}
}

func TestNewReplicaRefusesBadInput(t *testing.T) {
	newAlloc := func() (*quota.Allocator, error) { return nil, nil }
	if _, err := quotaservice.NewReplica(nil, "127.0.0.1:1", newAlloc); err == nil {
		t.Error("a replica without an etcd client")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for _, tc := range []struct {
		addr string
		opts []quotaservice.ReplicaOption
	}{
		{"", nil},
		{string(make([]byte, 65)), nil},
		{"127.0.0.1:1", []quotaservice.ReplicaOption{quotaservice.WithSessionTTL(1)}},
		{"127.0.0.1:1", []quotaservice.ReplicaOption{quotaservice.WithElectionPrefix("")}},
	} {
		if _, err := quotaservice.NewReplica(cli, tc.addr, newAlloc, tc.opts...); err == nil {
			t.Errorf("NewReplica(%q, %d options) succeeded", tc.addr, len(tc.opts))
		}
	}
}

// A leader whose etcd stops answering (SIGSTOP, longer than the session
// TTL) stops granting: tasks keep the leases they hold, then their
// fallback; when etcd comes back a leader grants again.
func TestLeaderStopsGrantingWhenEtcdIsAway(t *testing.T) {
	e := etcdtest.Start(t)
	const ttl = 2
	var ps []*replicaProc
	for range 2 {
		ps = append(ps, startReplica(t, e, ttl, 10*time.Second))
	}
	waitFor(t, 10*time.Second, "a leader", func() bool { return len(leaders(ps)) == 1 })
	conns := map[string]grpc.ClientConnInterface{}
	for _, p := range ps {
		cc, err := grpc.NewClient(p.addr, append(quotaservice.DialOptions(time.Second), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		conns[p.addr] = cc
	}
	usage, _ := quota.NewUsage()
	leased := quota.NewLeased(nil, nil)
	qc, err := quotaservice.NewClient(nil, "task-1", usage, leased, quotaservice.WithReplicas(conns))
	if err != nil {
		t.Fatal(err)
	}
	refresh := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return qc.RefreshOnce(ctx)
	}
	if err := refresh(); err != nil {
		t.Fatal(err)
	}
	if err := e.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	// Past half the TTL without a renewal no replica may grant, however
	// late this test looks (the session itself would last until up to the
	// TTL after its last renewal).
	wait := time.Duration(ttl)*time.Second/2 + 100*time.Millisecond
	tm := time.NewTimer(wait)
	<-tm.C
	if l := leaders(ps); len(l) != 0 {
		t.Fatalf("%d replicas grant %v after etcd stopped answering (session TTL %d s)", len(l), time.Since(paused), ttl)
	}
	if err := refresh(); err == nil {
		t.Fatal("a refresh got a lease while etcd was away")
	}
	if _, ok := leased.Current(); !ok {
		t.Error("the task lost the lease it held (10 s) while etcd was away")
	}
	if err := e.Resume(); err != nil {
		t.Fatal(err)
	}
	back := waitFor(t, 30*time.Second, "a leader after etcd came back", func() bool { return len(leaders(ps)) == 1 })
	if err := refresh(); err != nil {
		t.Fatalf("refresh after etcd came back: %v", err)
	}
	t.Logf("no replica granted %v after etcd stopped (TTL %d s); a leader %v after it came back", wait, ttl, back)
}
