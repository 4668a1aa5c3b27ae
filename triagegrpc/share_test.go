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
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagegrpc"
)

// shareServer is a Server with admission control on a fake clock, driven
// through its tap handle and stats handler as grpc-go drives them.
type shareServer struct {
	sh stats.Handler
	in tap.ServerInHandle
}

func newShareServer(t *testing.T, opts ...triagegrpc.ServerOption) shareServer {
	t.Helper()
	ctl, err := admission.New(admission.WithClock(clock.NewFake(time.Unix(0, 0))), admission.WithLimits(1, 1, 1), admission.WithInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := triagegrpc.NewServer(append(opts, triagegrpc.WithIntake(intake.WithAdmission(ctl)))...)
	if err != nil {
		t.Fatal(err)
	}
	return shareServer{srv.StatsHandler(), srv.TapHandle()}
}

func (s shareServer) conn() context.Context {
	return s.sh.TagConn(context.Background(), &stats.ConnTagInfo{})
}

func (s shareServer) arrive(conn context.Context) (context.Context, error) {
	return s.in(conn, &tap.Info{FullMethodName: "/pkg.Svc/Method", Header: metadata.MD{}})
}

// burst opens streams on conn whose goroutines do not run until one is
// refused, and returns them.
func (s shareServer) burst(t *testing.T, conn context.Context) []context.Context {
	t.Helper()
	var streams []context.Context
	for len(streams) < 1000 {
		c, err := s.arrive(conn)
		if err != nil {
			return streams
		}
		streams = append(streams, c)
	}
	t.Fatal("1000 streams and the task never filled")
	return nil
}

// One connection's burst takes only half the task's room once it holds
// its share of streams waiting for their goroutines; another connection
// still gets its share in, and its room back as its goroutines run
// (TagRPC), while the bursting connection stays refused.
func TestConnectionShareOfAFullTask(t *testing.T) {
	alone := newShareServer(t, triagegrpc.WithIntake(intake.WithConnShare(0)))
	room := len(alone.burst(t, alone.conn()))
	if room < 2*intake.DefaultConnShare {
		t.Fatalf("room %d: too small for the test", room)
	}

	s := newShareServer(t)
	a := s.burst(t, s.conn())
	if want := (room + 1) / 2; len(a) != want {
		t.Fatalf("room %d: one connection's burst took %d, want %d", room, len(a), want)
	}
	b := s.conn()
	streams := s.burst(t, b)
	if want := min(intake.DefaultConnShare, room-len(a)); len(streams) != want {
		t.Fatalf("room %d, %d taken by a burst: another connection got %d, want %d", room, len(a), len(streams), want)
	}
	for _, c := range streams {
		s.sh.TagRPC(c, &stats.RPCTagInfo{FullMethodName: "/pkg.Svc/Method"})
	}
	if _, err := s.arrive(b); err != nil {
		t.Fatalf("once its streams' goroutines ran: %v", err)
	}
	if _, err := s.arrive(s.conn()); err != nil {
		t.Fatalf("a third connection: %v", err)
	}
	// Over its share, the bursting connection gets nothing past half the
	// room, though the task has room.
	if _, err := s.arrive(a[0]); err == nil {
		t.Fatal("the bursting connection admitted past half the room")
	}
}

// Issue 38: streams grpc-go drops after the tap (a malformed method name,
// a grpc-timeout of 0) are refused by the tap itself and leave no count
// on their connection: after many of them, its streams still get their
// share of a task another connection's burst has half filled.
func TestStreamsDroppedAfterTheTapLeaveNoCount(t *testing.T) {
	alone := newShareServer(t, triagegrpc.WithIntake(intake.WithConnShare(0)))
	room := len(alone.burst(t, alone.conn()))

	s := newShareServer(t)
	a := s.conn()
	expired, cancel := context.WithCancel(a) // grpc-timeout 0: done before the tap
	cancel()
	for range 4 * intake.DefaultConnShare {
		if _, err := s.in(expired, &tap.Info{FullMethodName: "/pkg.Svc/Method", Header: metadata.MD{}}); err == nil {
			t.Fatal("a stream whose deadline has passed was accepted")
		}
		for _, name := range []string{"pkg.Svc/Method", "/pkgSvcMethod"} {
			if _, err := s.in(a, &tap.Info{FullMethodName: name, Header: metadata.MD{}}); err == nil {
				t.Fatalf("malformed method name %q accepted", name)
			}
		}
	}
	b := s.burst(t, s.conn())
	if want := (room + 1) / 2; len(b) != want {
		t.Fatalf("room %d: another connection's burst took %d, want %d", room, len(b), want)
	}
	if got, want := len(s.burst(t, a)), min(intake.DefaultConnShare, room-len(b)); got != want {
		t.Fatalf("after streams dropped after the tap: the connection got %d streams into a half-full task, want its share %d", got, want)
	}
}
