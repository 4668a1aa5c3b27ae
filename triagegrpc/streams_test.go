package triagegrpc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/triagegrpc"
)

// A client holding streams open without their messages (a slow sender)
// gets at most DefaultMaxConcurrentStreams of them per connection: the
// next waits on the client's side until one ends. Below the bound, a
// busy connection's calls reach the server.
func TestConnectionStreamsAreBounded(t *testing.T) {
	srv, err := triagegrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	// The server's stop waits for its thousand handlers: left running,
	// they allocate while the next test counts allocations.
	s := grpc.NewServer(append(srv.ServerOptions(), grpc.WaitForHandlers(true))...)
	relay.RegisterFunc(s, func(context.Context, string) (string, error) { return "", nil })
	cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, s))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
	// The first call makes sure the server's settings have arrived.
	if _, err := relay.Invoke(ctx, cc, "x"); err != nil {
		t.Fatal(err)
	}
	// A proxy's connection at 20x a task's capacity (20,000 calls a
	// second) with refusals taking 45 ms to come back has 900 calls open:
	// the next still reaches the server. (With 250 it waited on the
	// client's side, where no admission sees it: issue 54's 20x runs.)
	const proxyLoad = 900
	opening, cancelOpening := context.WithTimeout(ctx, 10*time.Second)
	defer cancelOpening()
	for i := 0; i < proxyLoad; i++ {
		if _, err := cc.NewStream(opening, desc, relay.CallMethod); err != nil {
			t.Fatalf("stream %d of a busy connection: %v, want it open", i, err)
		}
	}
	call, cancelCall := context.WithTimeout(ctx, 10*time.Second)
	defer cancelCall()
	if _, err := relay.Invoke(call, cc, "x"); err != nil {
		t.Fatalf("a call beside %d open streams on its connection: %v, want it answered by the server", proxyLoad, err)
	}
	for i := proxyLoad; i < triagegrpc.DefaultMaxConcurrentStreams; i++ {
		if _, err := cc.NewStream(ctx, desc, relay.CallMethod); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	// Waiting on the client's side is all the next stream can do: it is
	// cut off by its own deadline, never refused by the server.
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	_, err = cc.NewStream(short, desc, relay.CallMethod)
	if status.Code(err) != codes.DeadlineExceeded && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stream %d on one connection: %v, want it to wait for a free stream", triagegrpc.DefaultMaxConcurrentStreams+1, err)
	}
}
