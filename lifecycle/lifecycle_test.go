package lifecycle_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/lifecycle"
)

func TestSubscribeSeesEveryChangeInOrder(t *testing.T) {
	l, err := lifecycle.New(lifecycle.WithWarmup())
	if err != nil {
		t.Fatal(err)
	}
	var seen []bool
	unsubscribe := l.Subscribe(func(lame bool) { seen = append(seen, lame) })
	l.Ready()
	l.EnterLameDuck()
	unsubscribe()
	l.Ready()
	if want := []bool{true, false, true}; !slices.Equal(seen, want) {
		t.Errorf("the subscriber saw %v, want %v (the state at once, then each change until it unsubscribed)", seen, want)
	}
	if l.InLameDuck() {
		t.Error("in lame duck after Ready")
	}
}

func TestNewRefusesANegativeDrain(t *testing.T) {
	if _, err := lifecycle.New(lifecycle.WithDrain(-time.Second)); err == nil {
		t.Error("a negative drain accepted")
	}
}

// Shutdown enters lame duck, serves for the drain interval, then stops.
func TestShutdownDrainsThenStops(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	l, _ := lifecycle.New(lifecycle.WithDrain(10*time.Second), lifecycle.WithClock(clk))
	stopped := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- l.Shutdown(context.Background(), func(context.Context) error { close(stopped); return nil })
	}()
	clk.BlockUntil(1, nil) // Shutdown's drain timer
	if !l.InLameDuck() {
		t.Fatal("not in lame duck while draining")
	}
	clk.Advance(9 * time.Second)
	select {
	case <-stopped:
		t.Fatal("stopped before the drain interval")
	default:
	}
	clk.Advance(time.Second)
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	<-stopped
}

// An ended context cuts the drain short and is handed to stop, which
// stops hard; Shutdown returns the context's error.
func TestShutdownBoundedByItsContext(t *testing.T) {
	l, _ := lifecycle.New(lifecycle.WithDrain(time.Hour), lifecycle.WithClock(clock.NewFake(time.Unix(0, 0))))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stopCtxErr error
	err := l.Shutdown(ctx, func(c context.Context) error { stopCtxErr = c.Err(); return nil })
	if !errors.Is(err, context.Canceled) || !errors.Is(stopCtxErr, context.Canceled) {
		t.Errorf("Shutdown = %v with stop given a context ended by %v; want both canceled", err, stopCtxErr)
	}
}
