package quotareplica_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/triagehq/triage/quota/allocate"
	"github.com/triagehq/triage/quota/usage"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/testkit/etcdtest"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/grantlog"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotareplica"
	"github.com/triagehq/triage/wire"
)

// replicaProc is one replica with its own etcd client, through a proxy,
// and its own gRPC server, so that a test can crash it: the proxy cuts it
// off etcd at once (it cannot resign), and its lease expires after the
// session TTL, as after a SIGKILL.
type replicaProc struct {
	addr   string
	r      *quotareplica.Replica
	proxy  *etcdtest.Proxy
	gs     *grpc.Server
	cancel context.CancelFunc
	done   chan struct{}
}

// crash cuts the replica off etcd and stops it, and returns when it was
// cut off (its Run may take a while to give up on etcd afterwards).
func (p *replicaProc) crash() time.Time {
	p.proxy.Cut()
	cut := time.Now()
	p.cancel()
	p.gs.Stop()
	<-p.done
	return cut
}

func startReplica(t *testing.T, e *etcdtest.Server, ttl int, lease time.Duration) *replicaProc {
	t.Helper()
	return startReplicaWith(t, e, ttl, lease, quota.ModeOptimistic, 2, nil)
}

// startReplicaWith starts a replica whose Allocator runs in mode for tasks
// tasks, and whose Service calls log with every lease it grants.
func startReplicaWith(t *testing.T, e *etcdtest.Server, ttl int, lease time.Duration, mode quota.Mode, tasks int, log func(addr, task string, ls quota.Lease)) *replicaProc {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	policy, err := quota.New(quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 4}}, Tasks: tasks})
	if err != nil {
		t.Fatal(err)
	}
	proxy := e.NewProxy(t)
	addr := lis.Addr().String()
	var svcOpts []quotaservice.ServiceOption
	if log != nil {
		svcOpts = append(svcOpts, quotaservice.WithGrantLog(func(task string, ls quota.Lease) { log(addr, task, ls) }))
	}
	r, err := quotareplica.New(proxy.Client(t), addr, policy, func(p *quota.Policy, extra ...allocate.Option) (*allocate.Allocator, error) {
		return allocate.New(p, append(extra, allocate.WithLease(lease), allocate.WithRefresh(lease/4), allocate.WithMode(mode))...)
	}, quotareplica.WithSessionTTL(ttl), quotareplica.WithServiceOptions(svcOpts...))
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
	t.Parallel() // its own etcd and replicas
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
	table, _ := usage.New()
	leased := quota.NewLeased(nil, nil)
	qc, err := quotaservice.NewClient(nil, "task-1", table, leased, quotaservice.WithReplicas(conns))
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
	var rest []*replicaProc
	for _, p := range ps {
		if p != leader {
			rest = append(rest, p)
		}
	}
	// Watch for the next leader from before the crash: the crashed
	// replica's Run takes a while to give up on etcd.
	electedAt := make(chan time.Time, 1)
	go func() {
		tk := time.NewTicker(5 * time.Millisecond)
		defer tk.Stop()
		deadline := time.Now().Add(time.Duration(ttl)*time.Second + 10*time.Second)
		for len(leaders(rest)) != 1 && time.Now().Before(deadline) {
			<-tk.C
		}
		electedAt <- time.Now()
	}()
	crashed := leader.crash()
	elected := (<-electedAt).Sub(crashed)
	if len(leaders(rest)) != 1 {
		t.Fatalf("no new leader %v after the crash", elected)
	}
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
	newAlloc := func(*quota.Policy, ...allocate.Option) (*allocate.Allocator, error) { return nil, nil }
	policy, err := quota.New(quota.Config{Tasks: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := quotareplica.New(nil, "127.0.0.1:1", policy, newAlloc); err == nil {
		t.Error("a replica without an etcd client")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := quotareplica.New(cli, "127.0.0.1:1", nil, newAlloc); err == nil {
		t.Error("a replica without a policy")
	}
	for _, tc := range []struct {
		addr string
		opts []quotareplica.Option
	}{
		{"", nil},
		{string(make([]byte, 65)), nil},
		{"127.0.0.1:1", []quotareplica.Option{quotareplica.WithSessionTTL(1)}},
		{"127.0.0.1:1", []quotareplica.Option{quotareplica.WithElectionPrefix("")}},
	} {
		if _, err := quotareplica.New(cli, tc.addr, policy, newAlloc, tc.opts...); err == nil {
			t.Errorf("New(%q, %d options) succeeded", tc.addr, len(tc.opts))
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
	table, _ := usage.New()
	leased := quota.NewLeased(nil, nil)
	qc, err := quotaservice.NewClient(nil, "task-1", table, leased, quotaservice.WithReplicas(conns))
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

// partition cuts the replica off etcd but leaves it serving: a leader in
// doubt that tasks can still reach.
func (p *replicaProc) partition() { p.proxy.Cut() }

// In ModePessimistic across a failover, the shares of a customer's limit
// the tasks could hold at once never sum past 1, checked from every
// replica's grant log: the leader is cut off etcd but stays reachable
// (it must stop granting before another can be elected), and a new task
// appears while the new leader is learning (it must get nothing it does
// not hold).
func TestPessimisticFailoverGrantsNeverOverlap(t *testing.T) {
	t.Parallel() // its own etcd and replicas
	e := etcdtest.Start(t)
	const ttl = 2
	const lease = 2 * time.Second
	var (
		logMu sync.Mutex
		logs  []grantlog.Record
	)
	record := func(addr, task string, ls quota.Lease) {
		logMu.Lock()
		defer logMu.Unlock()
		for _, g := range ls.Grants {
			logs = append(logs, grantlog.Record{At: time.Now(), Replica: addr, Task: task, Customer: g.Customer, Share: g.Share, Lease: ls.Duration})
		}
	}
	var ps []*replicaProc
	for range 3 {
		ps = append(ps, startReplicaWith(t, e, ttl, lease, quota.ModePessimistic, 4, record))
	}
	waitFor(t, 10*time.Second, "a leader", func() bool { return len(leaders(ps)) == 1 })
	leader := leaders(ps)[0]
	conns := map[string]grpc.ClientConnInterface{}
	for _, p := range ps {
		cc, err := grpc.NewClient(p.addr, append(quotaservice.DialOptions(time.Second), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		conns[p.addr] = cc
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	var clients []*quotaservice.Client
	startTask := func(name string, cpuPerTick time.Duration) {
		table, _ := usage.New()
		leased := quota.NewLeased(nil, nil)
		qc, err := quotaservice.NewClient(nil, name, table, leased, quotaservice.WithReplicas(conns), quotaservice.WithRefresh(lease/4))
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, qc)
		wg.Add(2)
		go func() { defer wg.Done(); qc.Run(ctx) }()
		go func() { // demand: cpuPerTick of CPU every 50 ms
			defer wg.Done()
			tk := time.NewTicker(50 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
					table.Add("ads", criticality.Critical, cpuPerTick)
				}
			}
		}()
	}
	// ads's limit is 4 CPU; demand 1.2, 2.4 and 0.8 CPU: 1.1 of it.
	startTask("task-0", 60*time.Millisecond)
	startTask("task-1", 120*time.Millisecond)
	startTask("task-2", 40*time.Millisecond)
	refreshes := func(qc *quotaservice.Client) uint64 { ok, _ := qc.Refreshes(); return ok }
	waitFor(t, 20*time.Second, "tasks leasing past learning", func() bool {
		a := leader.r.Allocator()
		return a != nil && a.Refreshes() >= 3*uint64(3*lease/(lease/4))
	})
	leader.partition()
	cut := time.Now()
	var rest []*replicaProc
	for _, p := range ps {
		if p != leader {
			rest = append(rest, p)
		}
	}
	waitFor(t, 20*time.Second, "a new leader", func() bool { return len(leaders(rest)) == 1 })
	elected := time.Now()
	next := leaders(rest)[0]
	startTask("task-3", 40*time.Millisecond)
	var before []uint64
	for _, qc := range clients {
		before = append(before, refreshes(qc))
	}
	waitFor(t, 30*time.Second, "every task leasing from the new leader past its learning", func() bool {
		a := next.r.Allocator()
		if a == nil || a.Refreshes() < 4*uint64(2*lease/(lease/4)) {
			return false
		}
		for i, qc := range clients {
			if refreshes(qc) < before[i]+4 {
				return false
			}
		}
		return true
	})
	cancel()
	wg.Wait()
	logMu.Lock()
	defer logMu.Unlock()
	byReplica := map[string]int{}
	lastOld := time.Time{}
	for _, r := range logs {
		byReplica[r.Replica]++
		if r.Replica == leader.addr && r.At.After(lastOld) {
			lastOld = r.At
		}
	}
	peak := grantlog.MaxHeld(logs, 100*time.Millisecond)["ads"]
	t.Logf("%d grants (%v); the cut-off leader's last grant %v after the cut, a new leader %v after it; peak held %.3f at %v after the cut",
		len(logs), byReplica, lastOld.Sub(cut), elected.Sub(cut), peak.Sum, peak.At.Sub(cut))
	if len(byReplica) < 2 {
		t.Fatalf("grants from %d replicas: the test shows no failover", len(byReplica))
	}
	// No two leaders grant at once: the cut-off leader stopped half a TTL
	// after its last renewal, the new one could be elected only a TTL
	// after it.
	if !lastOld.Before(elected) {
		t.Errorf("the cut-off leader granted %v after the cut, past the new leader's election at %v", lastOld.Sub(cut), elected.Sub(cut))
	}
	if peak.Sum < 0.9 {
		t.Errorf("the tasks never held more than %.3f of the limit: the test shows nothing", peak.Sum)
	}
	if peak.Sum > 1+1e-9 {
		t.Errorf("the tasks could hold %.4f of ads's limit at once, %v after the cut", peak.Sum, peak.At.Sub(cut))
	}
}

// The term key tells a new leader what grants may be in force, in
// ModePessimistic: the first leader the service ever had hands a task
// that holds nothing the safe share at once; a leader re-elected with no
// other leader between (etcd was away) takes up its own Allocator, which
// holds every grant in force, and does not learn again; a leader after
// another one learns, handing such a task nothing for a lease.
func TestTermKeyDecidesWhatANewLeaderTrusts(t *testing.T) {
	t.Parallel() // its own etcd and replicas
	e := etcdtest.Start(t)
	const ttl = 2
	lease := 20 * time.Second // longer than the test: learning never ends by itself
	a := startReplicaWith(t, e, ttl, lease, quota.ModePessimistic, 2, nil)
	waitFor(t, 10*time.Second, "a leader", func() bool { return a.r.IsLeader() })
	ask := func(p *replicaProc, task string) float64 {
		t.Helper()
		cc, err := grpc.NewClient(p.addr, append(quotaservice.DialOptions(time.Second), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := quotapb.NewQuotaClient(cc).Refresh(ctx, &quotapb.RefreshRequest{Task: task, NoLease: true,
			Customers: []*quotapb.CustomerUsage{{Customer: "ads", Used: []float64{0, 0, 1, 0}, Demand: 1}}})
		if err != nil {
			t.Fatalf("refresh at %s: %v", p.addr, err)
		}
		for _, g := range resp.GetGrants() {
			if g.GetCustomer() == "ads" {
				return g.GetShare()
			}
		}
		t.Fatal("no grant of ads")
		return 0
	}
	if s := ask(a, "task-1"); s != 0.5 {
		t.Errorf("the first leader ever gave a task holding nothing %.3f, want the safe share 0.5", s)
	}
	first := a.r.Allocator()
	// etcd away past the TTL, then back: the same replica leads again.
	if err := e.Pause(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the leader to stop granting", func() bool { return !a.r.IsLeader() })
	// etcd runs on real time: let the session's lease expire while it is away.
	time.Sleep(time.Duration(ttl) * time.Second)
	if err := e.Resume(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the leader back", func() bool { return a.r.IsLeader() })
	if a.r.Elections() != 2 || a.r.Allocator() != first {
		t.Errorf("re-elected (%d elections): Allocator taken up again %v, want 2 and true", a.r.Elections(), a.r.Allocator() == first)
	}
	// Another replica after it: it learns.
	b := startReplicaWith(t, e, ttl, lease, quota.ModePessimistic, 2, nil)
	a.crash()
	waitFor(t, 20*time.Second, "the other replica leading", func() bool { return b.r.IsLeader() })
	if s := ask(b, "task-2"); s != 0 {
		t.Errorf("a leader after another gave a task holding nothing %.3f while learning, want 0", s)
	}
}
