package intake_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/trust"
)

// slowIntake is an Intake whose controller refuses late messages
// (admission.SchedulerDelay), on a fake clock, with room for many.
func slowIntake(t *testing.T, opts ...intake.Option) (*intake.Intake, *clock.Fake) {
	t.Helper()
	f := clock.NewFake(time.Unix(0, 0))
	ctl, err := admission.New(admission.WithClock(f), admission.WithDelayMeasure(admission.SchedulerDelay),
		admission.WithLimits(64, 64, 64), admission.WithInterval(time.Hour), admission.WithMaxWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	in, err := intake.New(append([]intake.Option{intake.WithAdmission(ctl)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return in, f
}

// late runs one request of conn whose message comes past the message
// timeout after its goroutine was ready: Start refuses it.
func late(t *testing.T, in *intake.Intake, f *clock.Fake, r *intake.Request) {
	t.Helper()
	h, err := in.Accept(context.Background(), r)
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	h.Scheduled()
	f.Advance(admission.DefaultMessageTimeout + time.Millisecond)
	h.MessageArrived()
	if err := h.Start(); !isLate(err) || !intake.SenderLate(h) {
		t.Fatalf("a message %v late: Start %v, SenderLate %v", admission.DefaultMessageTimeout, err, intake.SenderLate(h))
	}
}

func isLate(err error) bool {
	r, _, ok := admission.RejectionOf(err)
	return ok && r == admission.Late
}

// A connection whose request sent its message late has its next requests
// refused at Accept for its penalty (health checks aside, other
// connections unaffected); the penalty doubles while it offends again
// after it, and probation lets it hold at most its share of requests
// without their message.
func TestSlowSenderPenaltyAndProbation(t *testing.T) {
	in, f := slowIntake(t, intake.WithConnShare(2))
	conn, other := new(intake.Conn), new(intake.Conn)
	r := func(c *intake.Conn) *intake.Request { return &intake.Request{Path: "/svc/M", Conn: c} }
	late(t, in, f, r(conn))

	if _, err := in.Accept(context.Background(), r(conn)); err != intake.ErrSlowSender {
		t.Fatalf("during the penalty: %v, want ErrSlowSender", err)
	}
	if _, err := in.Accept(context.Background(), &intake.Request{Path: "/h", Conn: conn, HealthCheck: true}); err != nil {
		t.Fatalf("a health check during the penalty: %v", err)
	}
	if h, err := in.Accept(context.Background(), r(other)); err != nil {
		t.Fatalf("another connection: %v", err)
	} else {
		h.Abandon()
	}
	if n := in.SlowSenderRefusals(); n != 1 {
		t.Fatalf("%d refusals counted, want 1", n)
	}

	f.Advance(intake.DefaultSlowSenderPenalty)
	var held []*intake.Handle
	for i := range 2 {
		h, err := in.Accept(context.Background(), r(conn))
		if err != nil {
			t.Fatalf("on probation, request %d of a share of 2: %v", i, err)
		}
		if !h.Holds() {
			t.Fatalf("a request on probation does not say it holds its place")
		}
		held = append(held, h)
	}
	if _, err := in.Accept(context.Background(), r(conn)); err != intake.ErrSlowSender {
		t.Fatalf("on probation, over its share: %v, want ErrSlowSender", err)
	}
	held[0].Scheduled()
	held[0].MessageArrived() // its message came: it leaves the probation count
	h, err := in.Accept(context.Background(), r(conn))
	if err != nil {
		t.Fatalf("on probation, after one's message came: %v", err)
	}
	held[1].Abandon()
	h.Abandon()
	if err := held[0].Start(); err != nil {
		t.Fatal(err)
	}
	held[0].Finish()

	// Offending again on probation doubles the penalty.
	late(t, in, f, r(conn))
	f.Advance(intake.DefaultSlowSenderPenalty)
	f.Advance(time.Millisecond) // past the pace of the refusal to come
	if _, err := in.Accept(context.Background(), r(conn)); err != intake.ErrSlowSender {
		t.Fatalf("1 s into a doubled penalty: %v, want ErrSlowSender", err)
	}
	f.Advance(intake.DefaultSlowSenderPenalty)
	if h, err := in.Accept(context.Background(), r(conn)); err != nil {
		t.Fatalf("after a doubled penalty: %v", err)
	} else {
		h.Abandon()
	}
	// After probation, the connection is as new.
	f.Advance(intake.MaxSlowSenderPenalty)
	for i := range 4 {
		h, err := in.Accept(context.Background(), r(conn))
		if err != nil || h.Holds() {
			t.Fatalf("after probation, request %d: %v, holds %v", i, err, h.Holds())
		}
		defer h.Abandon()
	}
}

// Refusals as a slow sender come at most one per SlowSenderPace: the
// second waits on the clock for the pace.
func TestSlowSenderRefusalsArePacedOnTheClock(t *testing.T) {
	in, f := slowIntake(t)
	conn := new(intake.Conn)
	late(t, in, f, &intake.Request{Path: "/svc/M", Conn: conn})
	if _, err := in.Accept(context.Background(), &intake.Request{Path: "/svc/M", Conn: conn}); err != intake.ErrSlowSender {
		t.Fatalf("first: %v", err)
	}
	done := make(chan struct{})
	var second error
	go func() {
		defer close(done)
		_, second = in.Accept(context.Background(), &intake.Request{Path: "/svc/M", Conn: conn})
	}()
	if !f.BlockUntil(1, done) {
		t.Fatalf("the second refusal came without waiting for the pace: %v", second)
	}
	f.Advance(intake.SlowSenderPace)
	<-done
	if second != intake.ErrSlowSender {
		t.Fatalf("second: %v", second)
	}
	// A caller gone does not wait out the pace.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := in.Accept(ctx, &intake.Request{Path: "/svc/M", Conn: conn}); err != intake.ErrSlowSender {
		t.Fatalf("third: %v", err)
	}
}

// A trusted peer's connection (a proxy) is not penalised unless
// WithTrustedSlowSenderPenalty; its late request is still refused.
func TestTrustedSlowSenderIsNotPenalised(t *testing.T) {
	pol := trust.MustNew(trust.Config{Networks: []string{"127.0.0.0/8"}})
	peer := trust.Peer{Addr: netip.MustParseAddr("127.0.0.1")}
	for _, penalise := range []bool{false, true} {
		opts := []intake.Option{intake.WithTrust(pol)}
		if penalise {
			opts = append(opts, intake.WithTrustedSlowSenderPenalty())
		}
		in, f := slowIntake(t, opts...)
		conn := new(intake.Conn)
		late(t, in, f, &intake.Request{Path: "/svc/M", Conn: conn, Peer: peer})
		h, err := in.Accept(context.Background(), &intake.Request{Path: "/svc/M", Conn: conn, Peer: peer})
		if penalise != (err == intake.ErrSlowSender) {
			t.Fatalf("WithTrustedSlowSenderPenalty %v: next request %v", penalise, err)
		}
		if h != nil {
			h.Abandon()
		}
	}
}

// MessageTimedOut (a transport that waits for the message itself) counts
// as a late sender's and penalises the connection.
func TestMessageTimedOutPenalisesTheConnection(t *testing.T) {
	in, f := slowIntake(t)
	conn := new(intake.Conn)
	h, err := in.Accept(context.Background(), &intake.Request{Path: "/svc/M", Conn: conn})
	if err != nil {
		t.Fatal(err)
	}
	h.Scheduled()
	f.Advance(admission.DefaultMessageTimeout)
	h.MessageTimedOut()
	if !intake.SenderLate(h) || h.Start() == nil {
		t.Fatalf("after MessageTimedOut: SenderLate %v, want true and Start refused", intake.SenderLate(h))
	}
	if _, err := in.Accept(context.Background(), &intake.Request{Path: "/svc/M", Conn: conn}); err != intake.ErrSlowSender {
		t.Fatalf("next request: %v, want ErrSlowSender", err)
	}
}

// A connection's requests accepted and not yet running count toward its
// share: past it, they get only half the room (admission's
// admission.OverShare), and the requests of other connections still get the
// rest; with the share off (0), one connection's burst takes all of it.
func TestConnShareHalvesTheRoomOfABurst(t *testing.T) {
	burst := func(share int) (n, more int) {
		in, _ := slowIntake(t, intake.WithConnShare(share))
		take := func(conn func() *intake.Conn) (n int) {
			for {
				h, err := in.Accept(context.Background(), &intake.Request{Path: "/svc/M", Conn: conn()})
				if err != nil {
					return n
				}
				n++
				t.Cleanup(h.Abandon)
			}
		}
		c := new(intake.Conn)
		return take(func() *intake.Conn { return c }), take(func() *intake.Conn { return new(intake.Conn) })
	}
	room, none := burst(0)
	if none != 0 {
		t.Fatalf("without a share, a burst of %d left %d to other connections", room, none)
	}
	n, more := burst(2)
	if n+more != room || n > (room+1)/2+2 || n < 2 {
		t.Fatalf("room %d, share 2: one connection's burst took %d, other connections %d; want about half each", room, n, more)
	}
}

// WithPeerShare: past its share of requests in the task, an untrusted
// peer's next requests take only the first half of the room, however
// many connections it uses, so that another peer still finds room; a
// trusted peer is not counted, and the counts go when the requests end
// (issue 55).
func TestPeerShareLeavesRoomForOthers(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	ctl, err := admission.New(admission.WithClock(f), admission.WithLimits(2, 2, 2), admission.WithQueueFactor(4),
		admission.WithInterval(time.Hour), admission.WithMaxWait(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	in, err := intake.New(intake.WithAdmission(ctl), intake.WithClock(f), intake.WithPeerShare(2),
		intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"10.0.0.1/32"}})))
	if err != nil {
		t.Fatal(err)
	}
	attacker := trust.Peer{Addr: netip.MustParseAddr("192.0.2.7")}
	var held []*intake.Handle
	for i := 0; ; i++ {
		// a connection of its own for each request: the connection share never applies
		h, err := in.Accept(context.Background(), &intake.Request{Path: "/svc/M", Peer: attacker, Conn: new(intake.Conn)})
		if err != nil {
			break
		}
		held = append(held, h)
		if i > 100 {
			t.Fatal("the attacker was never refused")
		}
	}
	other := trust.Peer{Addr: netip.MustParseAddr("198.51.100.9")}
	h, err := in.Accept(context.Background(), &intake.Request{Path: "/svc/M", Peer: other, Conn: new(intake.Conn)})
	if err != nil {
		t.Fatalf("another peer, beside %d of the attacker's requests: %v, want admitted", len(held), err)
	}
	h.Abandon()
	proxy := trust.Peer{Addr: netip.MustParseAddr("10.0.0.1")}
	h, err = in.Accept(context.Background(), &intake.Request{Path: "/svc/M", Peer: proxy, Conn: new(intake.Conn)})
	if err != nil {
		t.Fatalf("a trusted proxy: %v, want admitted", err)
	}
	h.Abandon()
	for _, h := range held {
		h.Abandon()
	}
	// Its count is gone: the attacker is admitted to the whole room again.
	for i := range len(held) {
		h, err := in.Accept(context.Background(), &intake.Request{Path: "/svc/M", Peer: attacker, Conn: new(intake.Conn)})
		if err != nil {
			t.Fatalf("after its requests ended, the attacker's request %d: %v", i, err)
		}
		defer h.Abandon()
	}
}
