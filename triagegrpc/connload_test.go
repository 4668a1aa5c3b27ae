package triagegrpc_test

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/triagehq/triage/connload"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/triagegrpc"
)

type connEvents struct{ accepted, closed chan struct{} }

func (e connEvents) Accepted(time.Duration) { e.accepted <- struct{}{} }
func (e connEvents) Closed()                { e.closed <- struct{}{} }

// connLoadListener is a loopback connload.Listener whose events arrive on
// the returned channels.
func connLoadListener(t *testing.T) (*connload.Listener, connEvents) {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ev := connEvents{make(chan struct{}, 8), make(chan struct{}, 8)}
	l, err := connload.NewListener(raw, connload.WithObserver(ev))
	if err != nil {
		t.Fatal(err)
	}
	return l, ev
}

// With WithConnLoad, gRPC gets bare connections (*net.TCPConn) and the
// Listener still counts them open and closed, from gRPC's own events.
func TestWithConnLoad(t *testing.T) {
	l, ev := connLoadListener(t)
	bare := make(chan bool, 8)
	srv := connLoadServer(t, l)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(bareSpy{l, bare})
	defer srv.Stop()
	var ccs []*grpc.ClientConn
	for range 3 {
		cc := loopback.DialGRPC(t, l.Addr().String())
		if _, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		ccs = append(ccs, cc)
		<-ev.accepted
		if !<-bare {
			t.Fatal("gRPC got a wrapped connection")
		}
	}
	if s := l.Stats(); s.Open != 3 || s.Accepted != 3 {
		t.Fatalf("three clients connected: %+v", s)
	}
	ccs[0].Close()
	<-ev.closed
	if s := l.Stats(); s.Open != 2 {
		t.Fatalf("one client gone: %+v", s)
	}
}

// bareSpy reports whether each accepted connection is a bare TCP one.
type bareSpy struct {
	*connload.Listener
	bare chan<- bool
}

func (b bareSpy) Accept() (net.Conn, error) {
	c, err := b.Listener.Accept()
	if err == nil {
		_, ok := c.(*net.TCPConn)
		b.bare <- ok
	}
	return c, err
}

// A client idle for its idle timeout closes its connection (the server
// sees it end), and its next call opens a new one without failing.
func TestClientIdleTimeout(t *testing.T) {
	l, ev := connLoadListener(t)
	srv := connLoadServer(t, l)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(l)
	defer srv.Stop()
	cc := loopback.DialGRPC(t, l.Addr().String(), idleClient(t, 50*time.Millisecond).DialOptions()...)
	check := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	check()
	<-ev.accepted
	select {
	case <-ev.closed: // the client went idle and dropped its connection
	case <-time.After(10 * time.Second):
		t.Fatal("the idle client kept its connection")
	}
	if s := l.Stats(); s.Open != 0 {
		t.Fatalf("after the client went idle: %+v", s)
	}
	check() // back from idle, on a new connection
	<-ev.accepted
	if s := l.Stats(); s.Accepted != 2 {
		t.Fatalf("stats %+v, want a second connection", s)
	}
}

// WithConnLoad also reports calls and health checks: a connection carrying
// a call is busy until the call ends; a health Check and a health Watch
// opened are health checks, and the Watch stream, which stays open, does
// not make its connection busy.
func TestWithConnLoadCallsAndHealthChecks(t *testing.T) {
	l, ev := connLoadListener(t)
	entered, release := make(chan struct{}), make(chan struct{})
	srv := connLoadServer(t, l)
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "triage.test.Block",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Call", Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			entered <- struct{}{}
			<-release
			return in, nil
		}}},
	}, struct{}{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(l)
	defer srv.Stop()
	cc := loopback.DialGRPC(t, l.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(cc)
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	<-ev.accepted
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil { // the watch is open on the server
		t.Fatal(err)
	}
	// The Check's End event runs on the server after its answer was sent:
	// the client can see the answer first.
	loopback.WaitFor(t, "the check's end on the server", func() bool { return l.Stats().Busy == 0 })
	if s := l.Stats(); s.HealthChecks != 2 || s.Busy != 0 || s.Open != 1 {
		t.Fatalf("after a check and a watch: %+v, want 2 health checks, 0 busy of 1", s)
	}
	// A method the health service does not have is not a health check,
	// whatever its name says (the server's admission exempts exactly Check,
	// Watch and List too).
	if err := cc.Invoke(ctx, "/grpc.health.v1.Health/Other", new(emptypb.Empty), new(emptypb.Empty)); err == nil {
		t.Fatal("an unknown health method answered")
	}
	if s := l.Stats(); s.HealthChecks != 2 {
		t.Fatalf("after a call to an unknown method under the health service's name: %+v, want still 2 health checks", s)
	}
	done := make(chan error, 1)
	go func() { done <- cc.Invoke(ctx, "/triage.test.Block/Call", new(emptypb.Empty), new(emptypb.Empty)) }()
	<-entered
	if s := l.Stats(); s.Busy != 1 {
		t.Fatalf("during a call: %+v, want 1 busy", s)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The server counts the call's end after its response is written: the
	// client may see the response first. Wait for it (bounded).
	for deadline := time.Now().Add(5 * time.Second); l.Stats().Busy != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("after the call: %+v, want 0 busy", l.Stats())
		}
		runtime.Gosched()
	}
}

// connLoadServer is a gRPC server whose triage Server reports to l.
func connLoadServer(t *testing.T, l *connload.Listener) *grpc.Server {
	t.Helper()
	ts, err := triagegrpc.NewServer(triagegrpc.WithConnLoad(l))
	if err != nil {
		t.Fatal(err)
	}
	return grpc.NewServer(ts.ServerOptions()...)
}
