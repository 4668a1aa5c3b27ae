package rawgrpc_test

import (
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/triagehq/triage/bench/internal/rawgrpc"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagegrpc"
)

// Calls written as frames reach a grpc-go server with their headers,
// message and deadline, and come back with the server's statuses,
// triage's outcome details included.
func TestCallsAgainstGRPCGo(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		in := new(wrapperspb.StringValue)
		if err := ss.RecvMsg(in); err != nil {
			return err
		}
		md, _ := metadata.FromIncomingContext(ss.Context())
		dl, ok := ss.Context().Deadline()
		switch {
		case in.Value != "x":
			return status.Error(codes.InvalidArgument, "message "+in.Value)
		case !ok || time.Until(dl) > time.Second || time.Until(dl) < 500*time.Millisecond:
			return status.Errorf(codes.FailedPrecondition, "deadline %v", dl)
		case len(md.Get("triage-criticality")) == 1 && md.Get("triage-criticality")[0] == "SHEDDABLE":
			return triagegrpc.Status(outcome.New(outcome.TaskOverloaded, "concurrency")).Err()
		}
		return ss.SendMsg(wrapperspb.String("ok"))
	}))
	go gs.Serve(lis)
	defer gs.Stop()

	var mu sync.Mutex
	got := map[int]rawgrpc.Result{}
	all := make(chan struct{})
	msg, _ := proto.Marshal(wrapperspb.String("x"))
	const n = 200
	c, err := rawgrpc.Dial(lis.Addr().String(), "/any.Service/Method", msg, n, func(r rawgrpc.Result) {
		mu.Lock()
		defer mu.Unlock()
		got[r.ID] = r
		if len(got) == n {
			close(all)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range n {
		level := "CRITICAL"
		if i%2 == 1 {
			level = "SHEDDABLE"
		}
		if err := c.Send(i, []hpack.HeaderField{{Name: "triage-criticality", Value: level}}, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d of %d calls answered (read loop: %v)", len(got), n, c.Err())
	}
	for i := range n {
		r := got[i]
		want := codes.OK
		if i%2 == 1 {
			want = codes.Unavailable
		}
		if r.Code != want {
			t.Fatalf("call %d: %v (%v), want %v", i, r.Code, r.Err, want)
		}
		if i%2 == 1 {
			if e, ok := triagegrpc.FromStatus(status.Convert(r.Err)); !ok || e.Kind != outcome.TaskOverloaded {
				t.Fatalf("call %d: %v carries no task-overloaded outcome", i, r.Err)
			}
		}
	}
	if err := c.Send(n, nil, time.Second); err == nil {
		t.Error("a call beyond those the connection was made for was sent")
	}
}
