package lb_test

import (
	"context"
	"net"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/subset"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/lb"
)

// A subset member killed for good is replaced: after replaceAfter, calls
// reach one backend from outside the subset (one new connection, not
// every backend), and once the member serves again on its address the
// replacement leaves the subset.
func TestBalancerReplacesDeadSubsetMember(t *testing.T) {
	lb.Register()
	const n = 5
	lis := make([]net.Listener, n)
	for i := range lis {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis[i] = l
	}
	sort.Slice(lis, func(i, j int) bool { return lis[i].Addr().String() < lis[j].Addr().String() }) // the balancer's order
	served := make([]atomic.Int64, n)
	start := func(i int, l net.Listener) *grpc.Server {
		gs := grpc.NewServer()
		relay.Register(gs, &relay.Tier{Name: "backend", Fail: func(context.Context, string) error {
			served[i].Add(1)
			return nil
		}})
		go gs.Serve(l)
		t.Cleanup(gs.Stop)
		return gs
	}
	servers := make([]*grpc.Server, n)
	var eps []resolver.Endpoint
	for i, l := range lis {
		servers[i] = start(i, l)
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: l.Addr().String()}}})
	}
	members := subset.Deterministic{}.Subset(n, 0, 2)
	r := manual.NewBuilderWithScheme("replacetest")
	r.InitialState(resolver.State{Endpoints: eps})
	cc := loopback.DialGRPC(t, r.Scheme()+":///b", grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"triage":{"subsetSize":2,"clientId":0,"replaceAfter":"200ms"}}]}`))
	call := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		relay.Invoke(ctx, cc, "x")
	}
	counts := func() []int64 {
		out := make([]int64, n)
		for i := range served {
			out[i] = served[i].Load()
		}
		return out
	}
	// reached counts the backends whose count grew since then.
	reached := func(since []int64) (in, out int) {
		now := counts()
		for i := range now {
			if now[i] > since[i] {
				if i == members[0] || i == members[1] {
					in++
				} else {
					out++
				}
			}
		}
		return in, out
	}
	zero := make([]int64, n)
	for i := 0; i < 500; i++ { // until both members' connections are up
		call()
		if in, _ := reached(zero); in == 2 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if in, out := reached(zero); in != 2 || out != 0 {
		t.Fatalf("before the kill: calls reached %d members and %d others (%v), want the subset's 2", in, out, counts())
	}

	// Kill a member for good: its server stops, its port refuses.
	dead := members[0]
	addr := lis[dead].Addr().String()
	servers[dead].Stop()
	killed, mark := time.Now(), counts()
	var replacedAfter time.Duration
	for i := 0; i < 1000 && replacedAfter == 0; i++ {
		call()
		if _, out := reached(mark); out > 0 {
			replacedAfter = time.Since(killed)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if replacedAfter == 0 {
		t.Fatalf("no replacement in 1000 calls: %v", counts())
	}
	for range 50 {
		call()
	}
	if _, out := reached(mark); out != 1 {
		t.Fatalf("calls reached %d backends outside the subset, want one replacement: %v", out, counts())
	}
	t.Logf("a replacement served %v after the kill (replaceAfter 200ms)", replacedAfter)

	// The member serves again on its address: traffic returns to the
	// subset, the replacement gets none.
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", addr, err)
	}
	start(dead, l)
	for i := 0; i < 1000; i++ {
		call()
		if served[dead].Load() > mark[dead] {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if served[dead].Load() == mark[dead] {
		t.Fatal("the member back on its address got no call")
	}
	mark = counts()
	for range 40 {
		call()
	}
	if in, out := reached(mark); in != 2 || out != 0 {
		t.Fatalf("with the member back: calls reached %d members and %d others, want the subset alone", in, out)
	}
}

// A subset member entering lame duck (a rolling restart's drain) is
// replaced as soon as the announcement arrives, not after replaceAfter
// (a minute here): the client's calls go to the other member and one
// replacement, not all to the other member, and none fails. When the
// member is ready again, the replacement leaves.
func TestBalancerReplacesLameDuckMemberAtOnce(t *testing.T) {
	// With health checks the announcement is the member's health turning
	// NOT_SERVING; without, the trailer on its answers (the member is
	// then looked at again once the announcement expires, 5 s).
	t.Run("health", func(t *testing.T) { testLameDuckReplaced(t, `, "healthCheckConfig": {"serviceName": ""}`) })
	t.Run("trailer", func(t *testing.T) { testLameDuckReplaced(t, "") })
}

func testLameDuckReplaced(t *testing.T, healthCheck string) {
	lb.Register()
	const n = 5
	type backend struct {
		addr string
		lc   *lifecycle.Lifecycle
	}
	backends := make([]backend, n)
	for i := range backends {
		hs := health.NewServer()
		lc, err := triagegrpc.NewLifecycle(hs)
		if err != nil {
			t.Fatal(err)
		}
		srv, err := triagegrpc.NewServer(triagegrpc.WithLifecycle(lc))
		if err != nil {
			t.Fatal(err)
		}
		s := grpc.NewServer(srv.ServerOptions()...)
		healthpb.RegisterHealthServer(s, hs)
		backends[i] = backend{lc: lc}
		relay.Register(s, &relay.Tier{Name: "backend"})
		backends[i].addr = loopback.ServeGRPC(t, s)
	}
	sort.Slice(backends, func(i, j int) bool { return backends[i].addr < backends[j].addr }) // the balancer's order
	index := map[string]int{}
	var eps []resolver.Endpoint
	for i, b := range backends {
		index[b.addr] = i
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: b.addr}}})
	}
	members := subset.Deterministic{}.Subset(n, 0, 2)
	r := manual.NewBuilderWithScheme("lamereplace")
	r.InitialState(resolver.State{Endpoints: eps})
	cc := loopback.DialGRPC(t, r.Scheme()+":///b", grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"triage":{"subsetSize":2,"clientId":0,"replaceAfter":"1m"}}]`+healthCheck+`}`))
	// calls makes k calls and counts them by backend index.
	calls := func(k int) []int {
		got := make([]int, n)
		for range k {
			var p peer.Peer
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := relay.Invoke(ctx, cc, "x", grpc.Peer(&p))
			cancel()
			if err != nil {
				t.Fatalf("call failed: %v (counts %v)", err, got)
			}
			got[index[p.Addr.String()]]++
		}
		return got
	}
	outside := func(got []int) (reached int) {
		for i, c := range got {
			if c > 0 && i != members[0] && i != members[1] {
				reached++
			}
		}
		return reached
	}
	for got := calls(20); got[members[0]] == 0 || got[members[1]] == 0; got = calls(20) { // both members connected
		if outside(got) != 0 {
			t.Fatalf("before lame duck, calls left the subset: %v", got)
		}
	}

	backends[members[0]].lc.EnterLameDuck()
	calls(5) // the announcement arrives on these calls' trailers
	var got []int
	// The replacement connects within milliseconds; replaceAfter is a
	// minute. (The bound is only the loop's, not an assertion on time.)
	for start := time.Now(); time.Since(start) < 10*time.Second; {
		if got = calls(10); outside(got) > 0 {
			break
		}
	}
	if outside(got) != 1 {
		t.Fatalf("a member in lame duck: calls reached %d backends outside the subset, want its one replacement (%v)", outside(got), got)
	}

	backends[members[0]].lc.Ready()
	for start := time.Now(); time.Since(start) < 20*time.Second; {
		if got = calls(10); got[members[0]] > 0 && outside(got) == 0 {
			break
		}
	}
	if got[members[0]] == 0 || outside(got) != 0 {
		t.Fatalf("the member ready again: %v, want the subset alone", got)
	}
}
