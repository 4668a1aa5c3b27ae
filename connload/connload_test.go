package connload_test

import (
	"errors"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/connload"
)

func loopback(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// dial opens n client connections to l; they close with the test.
func dial(t *testing.T, l net.Listener, n int) {
	t.Helper()
	for range n {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
}

// acceptLoop accepts until the listener closes, handing each connection
// (or the final error) to the returned channels.
func acceptLoop(l net.Listener) (<-chan net.Conn, <-chan error) {
	conns, errs := make(chan net.Conn, 100), make(chan error, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				errs <- err
				return
			}
			conns <- c
		}
	}()
	return conns, errs
}

func none(t *testing.T, conns <-chan net.Conn, what string) {
	t.Helper()
	select {
	case <-conns:
		t.Fatalf("%s: a connection was accepted", what)
	default:
	}
}

// A storm is taken in at the accept rate: the burst at once, then one
// connection per 1/rate of (virtual) time, the rest waiting in the
// kernel's queue meanwhile.
func TestAcceptRate(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	l, err := connload.NewListener(loopback(t), connload.WithAcceptRate(10, 3), connload.WithClock(f))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dial(t, l, 6)
	conns, _ := acceptLoop(l)
	for range 3 {
		<-conns
	}
	// The 4th waits 100 ms for its token.
	if !f.BlockUntil(1, nil) {
		t.Fatal("no timer")
	}
	none(t, conns, "before its token")
	for i := range 3 {
		f.Advance(100 * time.Millisecond)
		<-conns
		if i < 2 && !f.BlockUntil(1, nil) {
			t.Fatal("no timer")
		}
	}
	s := l.Stats()
	if s.Open != 6 || s.Accepted != 6 || s.Delayed != 3 {
		t.Fatalf("stats %+v, want 6 open, 6 accepted, 3 delayed", s)
	}
	if s.Rate != 6 { // 6 accepts within the first second
		t.Errorf("rate %v, want 6", s.Rate)
	}
	f.Advance(20 * time.Second)
	if r := l.Stats().Rate; r != 0 {
		t.Errorf("rate %v after 20 quiet seconds", r)
	}
}

// At MaxOpen, the next connection waits until one closes; Utilization is
// the open share of the maximum.
func TestMaxOpen(t *testing.T) {
	l, err := connload.NewListener(loopback(t), connload.WithAcceptRate(0, 0), connload.WithMaxOpen(2))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dial(t, l, 3)
	conns, _ := acceptLoop(l)
	a, b := <-conns, <-conns
	if u := l.Utilization(); u != 1 {
		t.Fatalf("utilization %v at the maximum", u)
	}
	none(t, conns, "at the maximum")
	// The third Accept must be waiting for room before one closes.
	for deadline := time.Now().Add(5 * time.Second); l.Stats().Waiting != 1; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("no Accept waits at the maximum: %+v", l.Stats())
		}
	}
	a.Close()
	a.Close() // twice: counted once
	c := <-conns
	if s := l.Stats(); s.Open != 2 || s.Delayed != 1 {
		t.Fatalf("stats %+v", s)
	}
	b.Close()
	c.Close()
	if l.Utilization() != 0 || l.Stats().Open != 0 {
		t.Fatalf("all closed: %+v", l.Stats())
	}
	var _ interface {
		Name() string
		Utilization() float64
	} = l // an signals.Signal
}

// Closing the Listener ends an Accept that waits for the bounds.
func TestCloseEndsWaitingAccept(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	l, err := connload.NewListener(loopback(t), connload.WithAcceptRate(1, 1), connload.WithClock(f))
	if err != nil {
		t.Fatal(err)
	}
	dial(t, l, 2)
	conns, errs := acceptLoop(l)
	<-conns
	f.BlockUntil(1, nil) // the second waits for its token
	l.Close()
	if err := <-errs; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	l := loopback(t)
	defer l.Close()
	for _, o := range []connload.Option{
		connload.WithAcceptRate(-1, 1), connload.WithAcceptRate(10, 0), connload.WithMaxOpen(-1),
	} {
		if _, err := connload.NewListener(l, o); err == nil {
			t.Error("bad option accepted")
		}
	}
	if _, err := connload.NewListener(nil); err == nil {
		t.Error("nil listener accepted")
	}
}

// A tracked server reports its connections and their calls: busy is the
// connections carrying a call now, counted once however many calls; health
// checks have a count and a rate.
func TestTrackerBusyAndHealthChecks(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	l, err := connload.NewListener(loopback(t), connload.WithClock(f))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	tr := l.Track()
	a, b := tr.Open(), tr.Open()
	a.CallBegin()
	a.CallBegin()
	if s := l.Stats(); s.Open != 2 || s.Busy != 1 {
		t.Fatalf("two calls on one of two connections: %+v", s)
	}
	a.CallEnd()
	b.CallBegin()
	if s := l.Stats(); s.Busy != 2 {
		t.Fatalf("a call on each: %+v", s)
	}
	a.CallEnd()
	b.CallEnd()
	if s := l.Stats(); s.Busy != 0 || s.Open != 2 {
		t.Fatalf("no calls: %+v", s)
	}
	a.Close()
	a.Close() // twice: counted once
	if s := l.Stats(); s.Open != 1 {
		t.Fatalf("one closed: %+v", s)
	}
	for range 20 {
		l.HealthCheck()
	}
	f.Advance(1500 * time.Millisecond)
	if s := l.Stats(); s.HealthChecks != 20 || s.HealthCheckRate != 10 {
		t.Fatalf("20 checks in the first of two seconds: %+v", s)
	}
	f.Advance(20 * time.Second)
	if s := l.Stats(); s.HealthChecks != 20 || s.HealthCheckRate != 0 {
		t.Fatalf("after 20 quiet seconds: %+v", s)
	}
}
