package quotaservice_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/triagehq/triage/quota/allocate"
	"github.com/triagehq/triage/quota/usage"

	"github.com/triagehq/triage/internal/testkit/testcert"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
	"github.com/triagehq/triage/wire"
)

func quotaServer(t testing.TB, c quota.Config, opts ...allocate.Option) (addr string, a *allocate.Allocator) {
	t.Helper()
	p, err := quota.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if a, err = allocate.New(p, opts...); err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(quotapb.ServerOption())
	quotapb.RegisterQuotaServer(gs, quotaservice.NewService(a))
	return loopback.ServeGRPC(t, gs), a
}

// Two tasks report over loopback; each gets its share of a customer's
// limit by where the customer's demand lands (the customer wants more than
// its limit), and a malformed report is refused with INVALID_ARGUMENT.
func TestQuotaServiceOverLoopback(t *testing.T) {
	clk := clock.NewFake(time.Now())
	addr, _ := quotaServer(t, quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 1}}, Tasks: 2},
		allocate.WithLease(10*time.Second), allocate.WithRefresh(time.Second), allocate.WithClock(clk))
	clk.Advance(10 * time.Second) // past learning mode
	cc := loopback.DialGRPC(t, addr, quotaservice.DialOptions(time.Second)...)
	type task struct {
		u *usage.Table
		l *quota.Leased
		c *quotaservice.Client
	}
	var tasks []task
	for i, name := range []string{"task-a", "task-b"} {
		u, _ := usage.New()
		for range 100 * (1 + 2*i) { // task-b serves three times as much of ads
			u.Add("ads", criticality.Critical, time.Millisecond)
		}
		l := quota.NewLeased(nil, nil)
		c, err := quotaservice.NewClient(cc, name, u, l)
		if err != nil {
			t.Fatal(err)
		}
		tasks = append(tasks, task{u, l, c})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for round := range 2 { // the second round sees both tasks' demand
		for _, tk := range tasks {
			if err := tk.c.RefreshOnce(ctx); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
	}
	a, _ := tasks[0].l.Limit("ads", criticality.Critical)
	b, _ := tasks[1].l.Limit("ads", criticality.Critical)
	t.Logf("ads limit on task-a %.3f, task-b %.3f", a, b)
	if math.Abs(a+b-1) > 1e-6 || b < 2.5*a {
		t.Errorf("limits %.3f + %.3f: want 1 split about 1:3", a, b)
	}
	if ok, failed := tasks[0].c.Refreshes(); ok != 2 || failed != 0 {
		t.Errorf("refreshes %d ok, %d failed", ok, failed)
	}
	_, err := quotapb.NewQuotaClient(cc).Refresh(ctx, &quotapb.RefreshRequest{Task: "t", Customers: []*quotapb.CustomerUsage{{Customer: "ads", Demand: math.NaN()}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("NaN demand: %v", err)
	}
	if _, err := quotaservice.NewClient(cc, "bad task", tasks[0].u, tasks[0].l); err == nil {
		t.Error("bad task id accepted")
	}
}

// FuzzQuotaRefresh feeds arbitrary bytes to the quota service as a
// RefreshRequest: it answers a lease or INVALID_ARGUMENT, never panics,
// and a lease it answers is well formed.
func FuzzRefresh(f *testing.F) {
	for _, r := range []*quotapb.RefreshRequest{
		{Task: "t1", Customers: []*quotapb.CustomerUsage{{Customer: "ads", Used: []float64{0, 0, 1, 0}, Demand: 2}}},
		{Task: "t2", Customers: []*quotapb.CustomerUsage{{Customer: "(other)", Used: []float64{1}, Demand: 1}, {Customer: "b", Demand: 0}}},
		{Task: "", Customers: []*quotapb.CustomerUsage{{Customer: "a", Used: []float64{1, 2, 3, 4, 5}}}},
		{Task: "t3", Customers: []*quotapb.CustomerUsage{{Customer: "a"}, {Customer: "a"}}},
	} {
		f.Add(r.Marshal())
	}
	f.Add([]byte{})
	f.Add([]byte("\x0a\x02t1\x12\x0b\x0a\x01a\x11\x00\x00\x00\x00\x00\x00\xf8\x7f"))
	p, _ := quota.New(quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 4, ByCriticality: map[string]float64{"SHEDDABLE": 1}}}})
	a, _ := allocate.New(p, allocate.WithMaxTasks(1000))
	svc := quotaservice.NewService(a)
	f.Fuzz(func(t *testing.T, b []byte) {
		var req quotapb.RefreshRequest
		if req.Unmarshal(b) != nil {
			return
		}
		resp, err := svc.Refresh(context.Background(), &req)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.ResourceExhausted {
				t.Fatalf("error %v", err)
			}
			return
		}
		if resp.GetLeaseMs() <= 0 || resp.GetTasks() < 1 || len(resp.GetGrants()) > len(req.GetCustomers())+1 {
			t.Fatalf("lease %v", resp)
		}
		for _, g := range append(resp.GetGrants(), resp.GetDefault()) {
			if s := g.GetShare(); !(s >= 0 && s <= 1) || len(g.GetByCriticality()) != 4 {
				t.Fatalf("grant %v", g)
			}
		}
	})
}

// A request that names no customer (every untrusted caller's) is accounted
// under quota.Other, and the task's report still renews its lease (issue
// 21, item 1: it used to be charged to "", which made the quota service
// refuse every report from the task).
func TestRequestsWithoutACustomerKeepTheLease(t *testing.T) {
	addr, _ := quotaServer(t, quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 4}}, Tasks: 1})
	cc := loopback.DialGRPC(t, addr, quotaservice.DialOptions(time.Second)...)
	u, _ := usage.New()
	u.Add("ads", criticality.Critical, time.Millisecond)
	u.Add(quota.CustomerOf(context.Background()), criticality.Critical, time.Millisecond) // a request without a customer
	u.Refused("")
	l := quota.NewLeased(nil, nil)
	c, err := quotaservice.NewClient(cc, "task-a", u, l)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.RefreshOnce(ctx); err != nil {
		t.Fatalf("a report with a request that named no customer: %v", err)
	}
	for _, cu := range u.Snapshot() {
		if cu.Customer == "" {
			t.Fatalf("usage reported under the empty name: %+v", cu)
		}
	}
	if u.Total(quota.Other) <= 0 {
		t.Errorf("the request without a customer was not accounted under %s", quota.Other)
	}
}

// The obvious way to embed the service works (issue 21, item 9): on a
// grpc.Server made without any option, and on one given the Codec.
func TestServiceOnAnyServer(t *testing.T) {
	p, err := quota.New(quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 4}}, Tasks: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]grpc.ServerOption{nil, {quotapb.ServerOption()}} {
		a, err := allocate.New(p)
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer(opts...)
		quotapb.RegisterQuotaServer(gs, quotaservice.NewService(a))
		cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, gs))
		u, _ := usage.New()
		u.Add("ads", criticality.Critical, time.Millisecond)
		l := quota.NewLeased(nil, nil)
		c, err := quotaservice.NewClient(cc, "task-a", u, l)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = c.RefreshOnce(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%d server options: %v", len(opts), err)
		}
		if lim, _ := l.Limit("ads", criticality.Critical); lim != 2 {
			t.Errorf("%d server options: ads limit %v on the task, want 4/2", len(opts), lim)
		}
	}
}

// mtlsQuotaServer serves the service over TLS that requires and verifies
// client certificates, with task ids bound to identities.
func mtlsQuotaServer(t *testing.T, ca *testcert.CA, binds map[string]string) string {
	t.Helper()
	p, err := quota.New(quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 4}}, Tasks: 2})
	if err != nil {
		t.Fatal(err)
	}
	a, err := allocate.New(p)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Leaf("spiffe://test/quota-service")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{leaf}, ClientCAs: ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert}
	gs := grpc.NewServer(append(quotaservice.ServerOptions(), grpc.Creds(credentials.NewTLS(cfg)))...)
	quotapb.RegisterQuotaServer(gs, quotaservice.NewService(a, quotaservice.WithTaskIdentities(binds)))
	return loopback.ServeGRPC(t, gs)
}

// refreshAs reports as task over a connection with the given client
// certificate (none: nil).
func refreshAs(t *testing.T, addr string, ca *testcert.CA, cert *tls.Certificate, task string) error {
	t.Helper()
	cfg := &tls.Config{RootCAs: ca.Pool}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	cc := loopback.DialGRPC(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Fail fast (no WaitForReady): a refused handshake is UNAVAILABLE at
	// once.
	_, err := quotapb.NewQuotaClient(cc).Refresh(ctx, &quotapb.RefreshRequest{Task: task})
	return err
}

// The quota service refuses a caller without a valid certificate, and a
// valid caller that reports as another task (issue 21, item 3): task ids
// are bound to verified identities, as themselves or through the
// operator's map.
func TestQuotaServiceAuthenticatesTasks(t *testing.T) {
	ca, err := testcert.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	other, err := testcert.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(ca *testcert.CA, uri string) *tls.Certificate {
		c, err := ca.Leaf(uri)
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}
	addr := mtlsQuotaServer(t, ca, map[string]string{"spiffe://test/host-7": "db-7"})
	a := leaf(ca, "spiffe://test/db-0")
	for _, tc := range []struct {
		name string
		cert *tls.Certificate
		task string
		want codes.Code
	}{
		{"its own identity", a, "spiffe://test/db-0", codes.OK},
		{"another task", a, "spiffe://test/db-1", codes.PermissionDenied},
		{"mapped identity", leaf(ca, "spiffe://test/host-7"), "db-7", codes.OK},
		{"mapped identity as itself", leaf(ca, "spiffe://test/host-7"), "spiffe://test/host-7", codes.PermissionDenied},
		{"no certificate", nil, "spiffe://test/db-0", codes.Unavailable},
		{"certificate of another CA", leaf(other, "spiffe://test/db-0"), "spiffe://test/db-0", codes.Unavailable},
	} {
		err := refreshAs(t, addr, ca, tc.cert, tc.task)
		if got := status.Code(err); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// Leases keep renewing with 100,000 customers in the policy (issue 21,
// item 4): past allocate.LeaseNamedCustomers a lease carries only the
// customers its task reported, so it stays small; a customer the lease
// does not name but the task's own copy of the policy does is held to its
// policy limit with the default share, not to the default limit.
func TestLeasesRenewWithManyCustomers(t *testing.T) {
	cs := make(map[string]quota.Limit, 100000)
	for i := range 100000 {
		cs[fmt.Sprintf("customer-%06d", i)] = quota.Limit{CPU: 1 + float64(i%7)}
	}
	cfg := quota.Config{Customers: cs, Tasks: 2, Default: quota.Limit{CPU: 0.5}}
	addr, _ := quotaServer(t, cfg)
	p, err := quota.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cc := loopback.DialGRPC(t, addr, quotaservice.DialOptions(time.Second)...)
	u, _ := usage.New()
	u.Add("customer-000003", criticality.Critical, time.Millisecond)
	l := quota.NewLeased(nil, p)
	c, err := quotaservice.NewClient(cc, "task-a", u, l)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for round := range 3 {
		if err := c.RefreshOnce(ctx); err != nil {
			t.Fatalf("refresh %d: %v", round, err)
		}
	}
	ls, _ := l.Current()
	if !ls.Partial || len(ls.Grants) > 10 {
		t.Errorf("lease: partial %v, %d grants", ls.Partial, len(ls.Grants))
	}
	share := ls.Default.Share
	granted := -1.0
	for _, g := range ls.Grants {
		if g.Customer == "customer-000003" {
			granted = g.Share
		}
	}
	for _, tc := range []struct {
		customer string
		want     float64
	}{
		{"customer-000003", 4 * granted}, // reported: granted
		{"customer-000005", 6 * share},   // named, not reported: its policy limit
		{"stranger", 0.5 * share},        // not named: the default
	} {
		if got, _ := l.Limit(tc.customer, criticality.Critical); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: limit %v, want %v", tc.customer, got, tc.want)
		}
	}
}

// follower refuses every refresh, naming leader (none when empty).
type follower struct {
	quotapb.UnimplementedQuotaServer
	leader string
	calls  atomic.Int64
}

func (f *follower) Refresh(ctx context.Context, _ *quotapb.RefreshRequest) (*quotapb.RefreshResponse, error) {
	f.calls.Add(1)
	if f.leader != "" {
		grpc.SetTrailer(ctx, metadata.Pairs(wire.QuotaLeaderKey, f.leader))
	}
	return nil, status.Error(codes.Unavailable, "not the leader")
}

// A client of replicas asks each at most once per refresh and does not
// spend its round on a replica it has already asked: a follower whose
// knowledge of the leader lags names the dead leader the client just
// tried, and the client passes on to the replica it has not tried, the
// new leader (TestReplicasElectOneLeaderAndFailOver failed so under the
// race detector).
func TestClientSkipsALeaderHintItTried(t *testing.T) {
	dead := loopback.ServeGRPC(t, grpc.NewServer()) // no quota service: UNIMPLEMENTED
	// The replicas by the names they advertise, which order them: the
	// client asks "a-dead" first, then "b-lagging", which names "a-dead".
	lagging := &follower{leader: "a-dead"}
	gs := grpc.NewServer(quotapb.ServerOption())
	quotapb.RegisterQuotaServer(gs, lagging)
	laggingAddr := loopback.ServeGRPC(t, gs)
	leaderAddr, a := quotaServer(t, quota.Config{Tasks: 2})
	conns := map[string]grpc.ClientConnInterface{}
	for name, addr := range map[string]string{"a-dead": dead, "b-lagging": laggingAddr, "c-leader": leaderAddr} {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		conns[name] = cc
	}
	u, _ := usage.New()
	qc, err := quotaservice.NewClient(nil, "task-1", u, quota.NewLeased(nil, nil), quotaservice.WithReplicas(conns))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := qc.RefreshOnce(ctx); err != nil {
		t.Fatalf("refresh: %v (the lagging follower was asked %d times)", err, lagging.calls.Load())
	}
	if a.Refreshes() != 1 || lagging.calls.Load() != 1 {
		t.Errorf("the leader granted %d leases and the follower was asked %d times, want 1 and 1", a.Refreshes(), lagging.calls.Load())
	}
	many := map[string]grpc.ClientConnInterface{}
	for i := range quotaservice.MaxReplicas + 1 {
		many[fmt.Sprint("r", i)] = conns["c-leader"]
	}
	if _, err := quotaservice.NewClient(nil, "task-1", u, quota.NewLeased(nil, nil), quotaservice.WithReplicas(many)); err == nil {
		t.Errorf("a client of %d replicas", len(many))
	}
}
