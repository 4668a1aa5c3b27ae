package e2e

// Issue 20, a hostile peer over loopback: a slow sender opens streams and
// sends their messages late. With the server's default options a stream
// takes no room once its goroutine has run (the stats handler's TagRPC
// tells admission control), so the task never fills with streams waiting
// on their client; installed without the stats handler, its streams stop
// holding room after four target delays. Either way a message later than
// the message timeout is refused before its handler runs. The controller
// runs on a fake clock with the scheduler's delay measure, as a real
// server's does on the real one.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// slowServer serves relay's tier B with admission control on a fake clock,
// with the Server's own options (withStats) or only its tap handle and
// interceptors; tagged counts the streams whose goroutine has run.
type slowServer struct {
	f              *clock.Fake
	ctl            *admission.Controller
	srv            *triagegrpc.Server
	obs            *refusals
	served, tagged atomic.Int64
	ended          atomic.Int64 // RPCs ended (stats.End)
	cc             *grpc.ClientConn
	addr           string
	timers         int // the fake clock's pending timers once serving
}

func startSlowServer(t *testing.T, withStats bool) *slowServer {
	t.Helper()
	// The slow senders dial from 127.0.0.1, which is not trusted: a
	// trusted peer (a proxy) is not penalised for its callers' slowness.
	return startSlowServerWith(t, withStats, "127.0.0.2/32")
}

// startSlowServerWith trusts the network trusted, with the Server's
// options opts.
func startSlowServerWith(t *testing.T, withStats bool, trusted string, opts ...triagegrpc.ServerOption) *slowServer {
	t.Helper()
	s := &slowServer{f: clock.NewFake(time.Unix(0, 0)), obs: &refusals{}}
	var err error
	s.ctl, err = admission.New(admission.WithClock(s.f), admission.WithDelayMeasure(admission.SchedulerDelay),
		admission.WithLimits(1, 1, 1), admission.WithInterval(time.Hour), admission.WithObserver(s.obs))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := triagegrpc.NewServer(append([]triagegrpc.ServerOption{triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{trusted}})), intake.WithAdmission(s.ctl)),
		triagegrpc.WithServerClock(s.f)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	s.srv = srv
	gopts := []grpc.ServerOption{grpc.InTapHandle(srv.TapHandle()), grpc.ChainUnaryInterceptor(srv.UnaryInterceptor())}
	if withStats {
		gopts = srv.ServerOptions()
	}
	// Added after triage's, so it sees each stream after triage's did.
	gopts = append(gopts, grpc.StatsHandler(tagCounter{&s.tagged, &s.ended}))
	gs := grpc.NewServer(gopts...)
	relay.Register(gs, &relay.Tier{Name: "B", Fail: func(context.Context, string) error { s.served.Add(1); return nil }, Observe: func(relay.Arrival) {}})
	s.addr = loopback.ServeGRPC(t, gs)
	s.cc = plainConn(t, s.addr)
	s.timers = s.f.Pending()
	return s
}

// paced runs recv and, each time the tap waits on the fake clock to pace
// a slow sender's refusals, moves the clock on by the pace, until recv
// returns; it returns recv's error and how many paces passed.
func (s *slowServer) paced(recv func() error) (error, int) {
	var err error
	done := make(chan struct{})
	go func() { err = recv(); close(done) }()
	paces := 0
	for s.f.BlockUntil(s.timers+1, done) {
		select {
		case <-done:
			return err, paces
		default:
		}
		s.f.Advance(intake.SlowSenderPace)
		paces++
	}
	return err, paces
}

// openSlow opens up to n streams to the unary method and sends only their
// headers, each once the last one's goroutine has run, until the task
// refuses one.
func (s *slowServer) openSlow(t *testing.T, ctx context.Context, n int) []grpc.ClientStream {
	t.Helper()
	var slow []grpc.ClientStream
	desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
	tagged, refused := s.tagged.Load(), s.obs.n.Load()
	for len(slow) < n {
		cs, err := s.cc.NewStream(ctx, desc, relay.CallMethod)
		if err != nil {
			t.Fatal(err)
		}
		want := tagged + int64(len(slow)+1)
		waitFor(t, "the stream's goroutine to run", func() bool { return s.tagged.Load() >= want || s.obs.n.Load() > refused })
		if s.obs.n.Load() > refused {
			break // refused: the task is full of streams without messages
		}
		slow = append(slow, cs)
	}
	return slow
}

// lateMessages sends each stream's message past the message timeout and
// checks that it is refused, late, before its handler runs.
func (s *slowServer) lateMessages(t *testing.T, slow []grpc.ClientStream) {
	t.Helper()
	served := s.served.Load()
	s.f.Advance(admission.DefaultMessageTimeout + time.Millisecond)
	for i, cs := range slow {
		if err := cs.SendMsg(wrapperspb.String("slow")); err != nil {
			t.Fatalf("stream %d: send: %v", i, err)
		}
		cs.CloseSend()
		err := cs.RecvMsg(new(wrapperspb.StringValue))
		oe, ok := outcome.As(err)
		if status.Code(err) != codes.Unavailable || !errors.Is(err, outcome.ErrTaskOverloaded) || !ok || oe.Reason != admission.Late.String() {
			t.Fatalf("stream %d: a message past the message timeout got %v, want task overloaded, late", i, err)
		}
	}
	if n := s.served.Load() - served; n != 0 {
		t.Fatalf("%d handlers ran for late messages, want none", n)
	}
	waitFor(t, "every request to end", func() bool { st := s.ctl.Stats(); return st.Executing == 0 && st.Queued == 0 && st.Pending == 0 })
}

// With the Server's options, streams waiting for their messages take no
// room at all: 200 of them (the task's room is a few requests) are
// admitted, and a well-behaved call beside them is served at once, with
// no time passing.
func TestSlowSendersTakeNoRoom(t *testing.T) {
	s := startSlowServer(t, true)
	ctx, cancel := context.WithCancel(criticality.NewContext(context.Background(), criticality.Critical))
	defer cancel()
	slow := s.openSlow(t, ctx, 200)
	if len(slow) < 200 {
		t.Fatalf("refused after %d streams without messages: they hold room in the task", len(slow))
	}
	if st := s.ctl.Stats(); st.Pending != 0 {
		t.Fatalf("%d pending beside %d streams waiting on their client, want 0", st.Pending, len(slow))
	}
	if _, err := relay.Invoke(ctx, s.cc, "fresh"); err != nil {
		t.Fatalf("a call beside %d streams waiting for their messages: %v", len(slow), err)
	}
	if n := s.served.Load(); n != 1 {
		t.Fatalf("%d handlers ran, want 1 (the well-behaved call)", n)
	}
	s.lateMessages(t, slow)
}

// Without the stats handler, the task fills with streams waiting for
// their messages; four target delays on they hold no room, and a
// well-behaved call is admitted and served.
func TestSlowSendersAgeOut(t *testing.T) {
	s := startSlowServer(t, false)
	ctx, cancel := context.WithCancel(criticality.NewContext(context.Background(), criticality.Critical))
	defer cancel()
	slow := s.openSlow(t, ctx, 200)
	if len(slow) == 200 {
		t.Fatal("200 streams without messages and the task never filled")
	}
	if _, err := relay.Invoke(ctx, s.cc, "fresh"); status.Code(err) != codes.Unavailable {
		t.Fatalf("a call while the task is full: %v, want refused", err)
	}
	s.f.Advance(5 * admission.DefaultTargetDelay)
	if _, err := relay.Invoke(ctx, s.cc, "fresh"); err != nil {
		t.Fatalf("a call beside %d streams waiting for their messages: %v", len(slow), err)
	}
	if n := s.served.Load(); n != 1 {
		t.Fatalf("%d handlers ran, want 1 (the well-behaved call)", n)
	}
	s.lateMessages(t, slow)
}

// A connection whose messages came past the message timeout is a slow
// sender: for DefaultSlowSenderPenalty its next streams are refused at
// arrival, in the tap (no goroutine, no handler), while other connections
// are served; a connection that offends again soon after gets twice the
// penalty. Each late burst otherwise costs the task a goroutine wake-up
// and a refusal per stream, which is what steady traffic beside 1,000
// slow senders waited behind.
func TestSlowConnectionIsRefusedAtArrival(t *testing.T) {
	s := startSlowServer(t, true)
	ctx, cancel := context.WithCancel(criticality.NewContext(context.Background(), criticality.Critical))
	defer cancel()
	other := plainConn(t, s.addr)
	refusedAtArrival := func(what string) {
		t.Helper()
		served, tagged := s.served.Load(), s.tagged.Load()
		_, err := relay.Invoke(ctx, s.cc, "fresh")
		oe, ok := outcome.As(err)
		if status.Code(err) != codes.Unavailable || !ok || oe.Reason != admission.Late.String() {
			t.Fatalf("%s: a call on the slow connection got %v, want refused as late", what, err)
		}
		if s.served.Load() != served || s.tagged.Load() != tagged {
			t.Fatalf("%s: the refused call got a goroutine (%d) or a handler (%d)", what, s.tagged.Load()-tagged, s.served.Load()-served)
		}
	}
	served := func(cc *grpc.ClientConn, what string) {
		t.Helper()
		if _, err := relay.Invoke(ctx, cc, "fresh"); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	served(s.cc, "before any late message")
	s.lateMessages(t, s.openSlow(t, ctx, 3))
	refusedAtArrival("after its late messages")
	served(other, "another connection beside the slow one")
	s.f.Advance(intake.DefaultSlowSenderPenalty)
	served(s.cc, "once the penalty is over")
	// Again, soon after: twice the penalty.
	s.lateMessages(t, s.openSlow(t, ctx, 3))
	s.f.Advance(intake.DefaultSlowSenderPenalty + intake.DefaultSlowSenderPenalty/2)
	refusedAtArrival("a second offence, 1.5 penalties later")
	s.f.Advance(intake.DefaultSlowSenderPenalty / 2)
	served(s.cc, "after twice the penalty")
}

// refusals counts the controller's rejections.
type refusals struct{ n atomic.Int64 }

func (r *refusals) Observe(e admission.Event) {
	if e.Kind == admission.Rejected {
		r.n.Add(1)
	}
}

// tagCounter counts the RPCs whose goroutine has run (TagRPC) and those
// that ended.
type tagCounter struct{ n, ended *atomic.Int64 }

func (c tagCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	c.n.Add(1)
	return ctx
}

func (c tagCounter) HandleRPC(_ context.Context, st stats.RPCStats) {
	if _, ok := st.(*stats.End); ok {
		c.ended.Add(1)
	}
}
func (tagCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (tagCounter) HandleConn(context.Context, stats.ConnStats)                       {}

// Streams to a method the server does not have are admitted at the tap
// and never reach a handler (issue 21, item 2). With the Server's options
// each leaves nothing behind: after 20,000 of them every count is at its
// baseline. Installed without the stats handler (tap only), every count
// is back at its baseline four target delays later.
func TestUnknownMethodsLeaveNoCounts(t *testing.T) {
	for _, withStats := range []bool{true, false} {
		s := startSlowServer(t, withStats)
		ctx := criticality.NewContext(context.Background(), criticality.Sheddable)
		const calls = 20000
		var wg sync.WaitGroup
		var next atomic.Int64
		for w := 0; w < 16; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= calls {
					err := s.cc.Invoke(ctx, "/nope.Service/Nope", wrapperspb.String("x"), new(wrapperspb.StringValue))
					if c := status.Code(err); c != codes.Unimplemented && c != codes.Unavailable {
						t.Errorf("an unknown method: %v", err)
						return
					}
				}
			}()
		}
		wg.Wait()
		// With the stats handler, each stream is Scheduled as its goroutine
		// runs; without it (a tap-only install), the streams whose handler
		// never ran stop counting, per level too, four target delays after
		// they arrived.
		s.f.Advance(5 * admission.DefaultTargetDelay)
		var st admission.Stats
		waitFor(t, fmt.Sprintf("every count back at its baseline (stats handler %v)", withStats), func() bool {
			st = s.ctl.Stats()
			return st.Pending == 0 && st.Executing == 0 && st.Queued == 0 && st.NotStarted == [criticality.NumLevels]int64{}
		})
		t.Logf("stats handler %v: %d calls to an unknown method, then %+v", withStats, calls, st)
	}
}

// After its penalty a slow sender's connection is on probation for
// MaxSlowSenderPenalty: it may hold at most its share (WithConnShare, 8)
// of streams whose message has not come, and the next is refused at
// arrival, so that its next burst of late messages is a few streams, not
// hundreds. A stream leaves the count when its message comes or it ends.
// Other connections are not bound, nor is the connection once probation
// is over.
func TestConnectionOnProbationHoldsFewStreamsWithoutTheirMessage(t *testing.T) {
	s := startSlowServer(t, true)
	// Real time bounds the test: a stream admitted where it should have
	// been refused fails it instead of hanging.
	ctx, cancel := context.WithTimeout(criticality.NewContext(context.Background(), criticality.Critical), 20*time.Second)
	defer cancel()
	other := plainConn(t, s.addr)
	desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
	open := func(cc *grpc.ClientConn, ctx context.Context, n int) []grpc.ClientStream {
		t.Helper()
		var css []grpc.ClientStream
		for i := 0; i < n; i++ {
			cs, err := cc.NewStream(ctx, desc, relay.CallMethod)
			if err != nil {
				t.Fatal(err)
			}
			css = append(css, cs)
		}
		return css
	}
	refusedLate := func(what string, cs grpc.ClientStream) {
		t.Helper()
		err, _ := s.paced(func() error { return cs.RecvMsg(new(wrapperspb.StringValue)) })
		if oe, ok := outcome.As(err); status.Code(err) != codes.Unavailable || !ok || oe.Reason != admission.Late.String() {
			t.Fatalf("%s: got %v, want refused as late at arrival", what, err)
		}
	}
	tagged := func(want int64, what string) {
		t.Helper()
		waitFor(t, what, func() bool { return s.tagged.Load() >= want })
		if n := s.tagged.Load(); n != want {
			t.Fatalf("%s: %d goroutines ran, want %d", what, n, want)
		}
	}
	s.lateMessages(t, s.openSlow(t, ctx, 3))
	s.f.Advance(intake.DefaultSlowSenderPenalty) // the penalty is over: probation
	share := intake.DefaultConnShare

	before := s.tagged.Load()
	slowCtx, cancelSlow := context.WithCancel(ctx)
	slow := open(s.cc, slowCtx, share+4)
	for i, cs := range slow[share:] {
		refusedLate(fmt.Sprintf("stream %d of %d without its message on probation", share+i+1, len(slow)), cs)
	}
	tagged(before+int64(share), "the admitted streams' goroutines")
	if _, err := relay.Invoke(ctx, other, "fresh"); err != nil {
		t.Fatalf("another connection beside the one on probation: %v", err)
	}
	if err, _ := s.paced(func() error { _, err := relay.Invoke(ctx, s.cc, "fresh"); return err }); status.Code(err) != codes.Unavailable {
		t.Fatalf("a call on the connection holding its share of streams without messages: %v, want refused", err)
	}
	// One sends its message in time: served, and it leaves the count.
	if err := slow[0].SendMsg(wrapperspb.String("in time")); err != nil {
		t.Fatal(err)
	}
	slow[0].CloseSend()
	if err := slow[0].RecvMsg(new(wrapperspb.StringValue)); err != nil {
		t.Fatalf("a stream on probation that sent its message in time: %v", err)
	}
	if _, err := relay.Invoke(ctx, s.cc, "fresh"); err != nil {
		t.Fatalf("a call on the connection once one of its streams sent its message: %v", err)
	}
	// The others end without a message: they leave the count too.
	ended := s.ended.Load()
	cancelSlow()
	waitFor(t, "the cancelled streams to end", func() bool { return s.ended.Load() >= ended+int64(share-1) })
	before = s.tagged.Load()
	again := open(s.cc, ctx, share+1)
	refusedLate("past the share again", again[share])
	tagged(before+int64(share), "a full share again once the others ended")

	// Probation over: no bound.
	s.f.Advance(intake.MaxSlowSenderPenalty)
	if n := len(s.openSlow(t, ctx, 3*share)); n != 3*share {
		t.Fatalf("after probation: %d streams without messages, then refused; want %d", n, 3*share)
	}
	if _, err := relay.Invoke(ctx, s.cc, "fresh"); err != nil {
		t.Fatalf("a call after probation: %v", err)
	}
}

// The tap refuses a slow sender's streams at most one per
// SlowSenderPace, holding its connection's reader in between: on a
// connection serving its penalty, streams opened one after another at the
// same moment are refused, the first at once and each next one when the
// clock has moved on by a pace, none of them with a goroutine, while
// another connection is served with no time passing. However fast a slow
// sender opens streams, it costs the task at most one refusal per pace,
// and a burst of them is spread out instead of served ahead of everyone
// else.
func TestSlowSenderRefusalsArePaced(t *testing.T) {
	s := startSlowServer(t, true)
	// Real time bounds the test: a refusal that never comes fails it
	// instead of hanging.
	ctx, cancel := context.WithTimeout(criticality.NewContext(context.Background(), criticality.Critical), 20*time.Second)
	defer cancel()
	other := plainConn(t, s.addr)
	s.lateMessages(t, s.openSlow(t, ctx, 3)) // the penalty: 1 s
	tagged := s.tagged.Load()
	start := s.f.Now()
	const n = 20
	desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
	for i := 0; i < n; i++ {
		// One stream at a time: a timer on the fake clock can only be
		// this stream's pace.
		cs, err := s.cc.NewStream(ctx, desc, relay.CallMethod)
		if err != nil {
			t.Fatal(err)
		}
		err, p := s.paced(func() error { return cs.RecvMsg(new(wrapperspb.StringValue)) })
		if oe, ok := outcome.As(err); status.Code(err) != codes.Unavailable || !ok || oe.Reason != admission.Late.String() {
			t.Fatalf("stream %d on the slow connection: %v, want refused as late", i+1, err)
		}
		if want := min(i, 1); p != want {
			t.Fatalf("stream %d on the slow connection was refused after %d paces of the clock, want %d", i+1, p, want)
		}
	}
	if d, want := s.f.Now().Sub(start), (n-1)*intake.SlowSenderPace; d != want {
		t.Fatalf("%d refusals took %v of the clock, want %v", n, d, want)
	}
	// While the slow connection's reader waits on the clock, others are
	// served.
	cs, err := s.cc.NewStream(ctx, desc, relay.CallMethod)
	if err != nil {
		t.Fatal(err)
	}
	if !s.f.BlockUntil(s.timers+1, ctx.Done()) {
		t.Fatal("the next stream on the slow connection did not wait for its pace")
	}
	if _, err := relay.Invoke(ctx, other, "fresh"); err != nil {
		t.Fatalf("another connection while the slow one waits: %v", err)
	}
	if err, p := s.paced(func() error { return cs.RecvMsg(new(wrapperspb.StringValue)) }); status.Code(err) != codes.Unavailable || p != 1 {
		t.Fatalf("the waiting stream: %v after %d paces, want refused after one", err, p)
	}
	if got := s.tagged.Load() - tagged; got != 1 {
		t.Fatalf("%d goroutines ran, want 1 (the other connection's call)", got)
	}
	if got := s.srv.SlowSenderRefusals(); got != n+1 {
		t.Fatalf("the server counts %d refusals of a slow sender's streams, want %d", got, n+1)
	}
	// Past the penalty the connection is on probation, and under its
	// share: served.
	s.f.Advance(intake.DefaultSlowSenderPenalty)
	if _, err := relay.Invoke(ctx, s.cc, "fresh"); err != nil {
		t.Fatalf("a call once the penalty is over: %v", err)
	}
}

// Issue 38, a slow user behind a shared proxy connection: a trusted peer
// (a proxy the operator trusts, carrying many callers on one connection)
// is not penalised for one caller's late messages, which are still
// refused; WithTrustedSlowSenderPenalty penalises it as any other.
func TestTrustedProxyIsNotPenalisedForItsCallers(t *testing.T) {
	for _, penalise := range []bool{false, true} {
		var opts []triagegrpc.ServerOption
		if penalise {
			opts = append(opts, triagegrpc.WithIntake(intake.WithTrustedSlowSenderPenalty()))
		}
		s := startSlowServerWith(t, true, "127.0.0.1/32", opts...)
		ctx, cancel := context.WithCancel(criticality.NewContext(context.Background(), criticality.Critical))
		s.lateMessages(t, s.openSlow(t, ctx, 3))
		_, err := relay.Invoke(ctx, s.cc, "another caller on the proxy's connection")
		switch {
		case !penalise && err != nil:
			t.Fatalf("a trusted proxy's next call after one caller's late messages: %v, want served", err)
		case penalise && status.Code(err) != codes.Unavailable:
			t.Fatalf("with WithTrustedSlowSenderPenalty: %v, want refused at arrival", err)
		}
		cancel()
	}
}

// Issue 38: a stream to a method the server does not have gets no End
// event from grpc-go. On a connection on probation each such stream was
// counted for good, so that after its share of them the connection was
// refused every stream until it closed; now each leaves the count when
// its stream ends.
func TestUnknownMethodsOnProbationLeaveNoCount(t *testing.T) {
	s := startSlowServer(t, true)
	ctx, cancel := context.WithTimeout(criticality.NewContext(context.Background(), criticality.Critical), 20*time.Second)
	defer cancel()
	s.lateMessages(t, s.openSlow(t, ctx, 3))
	s.f.Advance(intake.DefaultSlowSenderPenalty) // the penalty is over: probation
	for i := range 3 * intake.DefaultConnShare {
		err, _ := s.paced(func() error {
			return s.cc.Invoke(ctx, "/nope.Service/Nope", wrapperspb.String("x"), new(wrapperspb.StringValue))
		})
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("unknown method %d on probation: %v, want Unimplemented", i, err)
		}
	}
	if err, _ := s.paced(func() error { _, err := relay.Invoke(ctx, s.cc, "fresh"); return err }); err != nil {
		t.Fatalf("a call on probation after %d calls to an unknown method: %v, want served", 3*intake.DefaultConnShare, err)
	}
}
