package triagegrpc_test

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
	"github.com/triagehq/triage/wire"
)

// A refusal at the tap is the path an overloaded server takes ten times
// for every request it serves: it allocates nothing.
func TestTapRefusalAllocatesNothing(t *testing.T) {
	h, ctx, info := fullTap(t)
	// AllocsPerRun counts the whole process's allocations: goroutines an
	// earlier test left winding down would be counted as the tap's.
	loopback.WaitFor(t, "the goroutines of earlier tests to end", func() bool { return runtime.NumGoroutine() <= 4 })
	admitted := 0
	n := testing.AllocsPerRun(1000, func() {
		if _, err := h(ctx, info); err == nil {
			admitted++
		}
	})
	if admitted > 0 {
		t.Fatalf("a full controller admitted %d of 1,001 requests", admitted)
	}
	if n != 0 {
		t.Errorf("a refusal at the tap allocates %.0f times", n)
	}
}

// fullTap returns the tap handle of a Server whose Controller is full
// (arrivals that never start hold every place it has, on a clock that
// does not move), and a request from a trusted loopback peer for it to
// refuse: the refusal path at the tap.
func fullTap(tb testing.TB) (tap.ServerInHandle, context.Context, *tap.Info) {
	ctl, err := admission.New(admission.WithClock(clock.NewFake(time.Unix(1e9, 0))))
	if err != nil {
		tb.Fatal(err)
	}
	var held int
	for ; held < 100_000; held++ {
		var tk admission.Ticket
		if ctl.Arrive(&tk, criticality.Critical, 0, time.Time{}, 0) != nil {
			break
		}
	}
	if held == 100_000 {
		tb.Fatal("the controller took 100,000 arrivals that never started")
	}
	s, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithAdmission(ctl), intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.0/8"}}))))
	if err != nil {
		tb.Fatal(err)
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}})
	md := metadata.MD{":authority": {"127.0.0.1:1"}, "content-type": {"application/grpc"}, "user-agent": {"grpc-go/1.85.0"}, "te": {"trailers"}, wire.CriticalityKey: {"CRITICAL"}}
	return s.TapHandle(), ctx, &tap.Info{FullMethodName: "/bench.Bench/Burn", Header: md}
}
