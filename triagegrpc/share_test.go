package triagegrpc_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/tap"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/triagegrpc"
)

// One connection's burst fills the task while its streams wait for their
// goroutines; another connection still gets ConnShare streams in, and
// its share back once their goroutines run (TagRPC), while the bursting
// connection stays refused.
func TestConnectionShareOfAFullTask(t *testing.T) {
	ctl, err := admission.New(admission.WithClock(clock.NewFake(time.Unix(0, 0))), admission.WithLimits(1, 1, 1), admission.WithInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := triagegrpc.NewServer(triagegrpc.WithAdmission(ctl))
	if err != nil {
		t.Fatal(err)
	}
	sh, in := srv.StatsHandler(), srv.TapHandle()
	conn := func() context.Context { return sh.TagConn(context.Background(), &stats.ConnTagInfo{}) }
	arrive := func(c context.Context) (context.Context, error) {
		return in(c, &tap.Info{FullMethodName: "/pkg.Svc/Method", Header: metadata.MD{}})
	}

	a := conn()
	room := 0
	for ; room < 1000; room++ {
		if _, err := arrive(a); err != nil {
			break
		}
	}
	if room <= triagegrpc.ConnShare || room == 1000 {
		t.Fatalf("one connection's burst: %d admitted", room)
	}

	b := conn()
	var streams []context.Context
	for i := 0; i < triagegrpc.ConnShare; i++ {
		s, err := arrive(b)
		if err != nil {
			t.Fatalf("stream %d of another connection beside the burst: %v", i, err)
		}
		streams = append(streams, s)
	}
	if _, err := arrive(b); err == nil {
		t.Fatalf("a stream past the connection's share (%d waiting) admitted into a full task", triagegrpc.ConnShare)
	}
	for _, s := range streams {
		sh.TagRPC(s, &stats.RPCTagInfo{FullMethodName: "/pkg.Svc/Method"})
	}
	if _, err := arrive(b); err != nil {
		t.Fatalf("once its streams' goroutines ran: %v", err)
	}
	if _, err := arrive(a); err == nil {
		t.Fatal("the bursting connection admitted past the full task")
	}
}
