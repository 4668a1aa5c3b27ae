package lb_test

import (
	"context"
	"net"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/triagehq/triage/internal/loopback"
	"github.com/triagehq/triage/internal/relay"
	"github.com/triagehq/triage/subset"
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
