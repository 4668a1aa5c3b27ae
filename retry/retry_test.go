package retry_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustNew(t *testing.T, opts ...retry.Option) *retry.Policy {
	t.Helper()
	p, err := retry.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// recorder is an Observer that counts.
type recorder struct {
	requested, accepted, rejected, throttled, retried, refused, exhausted int
}

func (r *recorder) Requested(criticality.Level) { r.requested++ }
func (r *recorder) Answered(_ criticality.Level, ok bool) {
	if ok {
		r.accepted++
	} else {
		r.rejected++
	}
}
func (r *recorder) Throttled(criticality.Level)     { r.throttled++ }
func (r *recorder) Retried(criticality.Level)       { r.retried++ }
func (r *recorder) BudgetRefused(criticality.Level) { r.refused++ }
func (r *recorder) Exhausted(criticality.Level)     { r.exhausted++ }

func overloaded() error { return &outcome.Error{Kind: outcome.TaskOverloaded, Downstream: true} }

func TestOnlyTaskOverloadedIsRetried(t *testing.T) {
	plain := errors.New("boom")
	for _, tc := range []struct {
		name     string
		err      error
		attempts int
	}{
		{"task overloaded", overloaded(), 3},
		{"don't retry", &outcome.Error{Kind: outcome.DontRetry, Downstream: true}, 1},
		{"out of quota", &outcome.Error{Kind: outcome.OutOfQuota, Downstream: true}, 1},
		{"other error", plain, 1},
	} {
		p := mustNew(t, retry.WithBackoff(0, 0), retry.WithoutThrottle())
		var seen []int
		err := p.Do(context.Background(), func(ctx context.Context) error {
			seen = append(seen, attempt.Outgoing(ctx))
			return tc.err
		})
		if len(seen) != tc.attempts {
			t.Errorf("%s: %d attempts, want %d", tc.name, len(seen), tc.attempts)
		}
		if tc.attempts == 1 && err != tc.err {
			t.Errorf("%s: Do returned %v, want the call's own error", tc.name, err)
		}
	}
}

func TestAttemptsCarryTheirNumberAndGiveUpAsDontRetry(t *testing.T) {
	rec := &recorder{}
	p := mustNew(t, retry.WithBackoff(0, 0), retry.WithoutThrottle(), retry.WithObserver(rec))
	var seen []int
	ctx := criticality.NewContext(context.Background(), criticality.Sheddable)
	err := p.Do(ctx, func(ctx context.Context) error {
		seen = append(seen, attempt.Outgoing(ctx))
		if criticality.Of(ctx) != criticality.Sheddable {
			t.Errorf("attempt lost the criticality")
		}
		return overloaded()
	})
	if len(seen) != 3 || seen[0] != 0 || seen[1] != 1 || seen[2] != 2 {
		t.Fatalf("attempt numbers %v, want [0 1 2]", seen)
	}
	oe, ok := outcome.As(err)
	if !ok || oe.Kind != outcome.DontRetry || !oe.Downstream || oe.Local || oe.Reason != "attempts exhausted" {
		t.Fatalf("gave up with %#v", err)
	}
	if !errors.Is(err, outcome.ErrDontRetry) {
		t.Fatal("errors.Is(err, ErrDontRetry) is false")
	}
	if rec.requested != 1 || rec.rejected != 3 || rec.retried != 2 || rec.exhausted != 1 {
		t.Fatalf("observer saw %+v", *rec)
	}
}

func TestSuccessAfterRetry(t *testing.T) {
	p := mustNew(t, retry.WithBackoff(0, 0), retry.WithoutThrottle())
	n := 0
	err := p.Do(context.Background(), func(context.Context) error {
		n++
		if n == 1 {
			return overloaded()
		}
		return nil
	})
	if err != nil || n != 2 {
		t.Fatalf("err %v after %d attempts", err, n)
	}
}

func TestRetryableOptIn(t *testing.T) {
	transient := errors.New("connection reset")
	p := mustNew(t, retry.WithBackoff(0, 0), retry.WithoutThrottle(),
		retry.WithRetryable(func(err error) bool { return errors.Is(err, transient) }))
	n := 0
	err := p.Do(context.Background(), func(context.Context) error { n++; return transient })
	if n != 3 || err != transient {
		t.Fatalf("%d attempts, err %v; want 3 and the error itself", n, err)
	}
}

func TestMaxAttemptsOption(t *testing.T) {
	p := mustNew(t, retry.WithBackoff(0, 0), retry.WithoutThrottle(), retry.WithMaxAttempts(1))
	n := 0
	err := p.Do(context.Background(), func(context.Context) error { n++; return overloaded() })
	if n != 1 || !errors.Is(err, outcome.ErrDontRetry) {
		t.Fatalf("%d attempts, err %v", n, err)
	}
}

func TestThrottledLocallyIsNeverSent(t *testing.T) {
	f := clock.NewFake(epoch)
	rec := &recorder{}
	p := mustNew(t, retry.WithClock(f), retry.WithBackoff(0, 0), retry.WithObserver(rec), retry.WithoutBudget(),
		retry.WithRandom(func() float64 { return 0 }))
	// 100 overloaded requests: 300 attempts rejected, none accepted.
	for i := 0; i < 100; i++ {
		p.Do(context.Background(), func(context.Context) error { return overloaded() })
	}
	sent := false
	err := p.Do(context.Background(), func(context.Context) error { sent = true; return nil })
	oe, ok := outcome.As(err)
	if sent || !ok || oe.Kind != outcome.DontRetry || !oe.Local {
		t.Fatalf("sent=%v err=%v; want a local don't-retry rejection without sending", sent, err)
	}
	if rec.throttled == 0 {
		t.Fatal("observer not told of the local rejection")
	}
}

func TestBudgetRefusesBeyondTenPercent(t *testing.T) {
	f := clock.NewFake(epoch)
	rec := &recorder{}
	p := mustNew(t, retry.WithClock(f), retry.WithBackoff(0, 0), retry.WithoutThrottle(), retry.WithObserver(rec))
	attempts := 0
	for i := 0; i < 1000; i++ {
		err := p.Do(context.Background(), func(context.Context) error { attempts++; return overloaded() })
		if !errors.Is(err, outcome.ErrDontRetry) {
			t.Fatalf("request %d: %v", i, err)
		}
		f.Advance(10 * time.Millisecond)
	}
	// 1000 requests in 10 s, all in the one-minute window: retries < 10% + 1.
	if rec.retried > 101 || rec.retried < 99 {
		t.Fatalf("%d retries for 1000 requests", rec.retried)
	}
	if rec.refused == 0 || attempts != 1000+rec.retried {
		t.Fatalf("refused %d, attempts %d", rec.refused, attempts)
	}
}

// Sheddable retries use at most half the budget, and leave the rest to
// critical ones: after sheddable requests have spent their half, a CRITICAL
// request is still retried; sheddable ones are not.
func TestBudgetKeepsRoomForCriticalRetries(t *testing.T) {
	b, err := retry.NewBudget(retry.DefaultRatio, time.Minute, clock.NewFake(epoch))
	if err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		b.Request()
	}
	shed := 0
	for b.TryRetry(criticality.Sheddable) {
		shed++
	}
	if shed < 50 || shed > 51 {
		t.Fatalf("%d SHEDDABLE retries for 1000 requests, want half the 10%%", shed)
	}
	if b.TryRetry(criticality.SheddablePlus) {
		t.Fatal("a SHEDDABLE_PLUS retry past half the budget")
	}
	crit := 0
	for b.TryRetry(criticality.Critical) {
		crit++
	}
	if total := shed + crit; total < 100 || total > 101 {
		t.Fatalf("%d sheddable and %d CRITICAL retries: the budget is 10%% + 1 in all", shed, crit)
	}
}

// timerLog is a clock that records the duration of every timer it makes.
type timerLog struct {
	*clock.Fake
	mu    sync.Mutex
	waits []time.Duration
}

func (c *timerLog) NewTimer(d time.Duration) clock.Timer {
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.mu.Unlock()
	return c.Fake.NewTimer(d)
}

func (c *timerLog) log() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

// Backoff waits on the clock, with full jitter below the exponential bound.
func TestBackoffWaitsOnTheClock(t *testing.T) {
	c := &timerLog{Fake: clock.NewFake(epoch)}
	p := mustNew(t, retry.WithClock(c), retry.WithoutThrottle(), retry.WithoutBudget(),
		retry.WithBackoff(100*time.Millisecond, 150*time.Millisecond), retry.WithRandom(func() float64 { return 0.5 }))
	done := make(chan error, 1)
	n := 0
	go func() { done <- p.Do(context.Background(), func(context.Context) error { n++; return overloaded() }) }()
	stop := make(chan struct{})
	defer close(stop)
	for i := 0; i < 2; i++ {
		if !c.BlockUntil(1, stop) {
			t.Fatal("no backoff timer")
		}
		select {
		case err := <-done:
			t.Fatalf("Do returned %v before the backoff elapsed", err)
		default:
		}
		// Advance by exactly the pending wait: a longer step would also
		// fire the next backoff timer if the retry made it while the step
		// was under way, and the loop would wait for it forever.
		waits := c.log()
		c.Advance(waits[len(waits)-1])
	}
	<-done
	// bounds 100 ms, then 200 ms capped at 150 ms; jitter 0.5.
	if w := c.log(); n != 3 || len(w) != 2 || w[0] != 50*time.Millisecond || w[1] != 75*time.Millisecond {
		t.Fatalf("%d attempts, waits %v; want 3 and [50ms 75ms]", n, w)
	}
}

// The deadlines of contexts are real time, so these tests start the fake
// clock at the real time and use deadlines far from it.
func TestNeverRetriesPastTheDeadline(t *testing.T) {
	f := clock.NewFake(time.Now())
	p := mustNew(t, retry.WithClock(f), retry.WithoutThrottle(), retry.WithoutBudget(),
		retry.WithBackoff(time.Minute, time.Minute), retry.WithRandom(func() float64 { return 0.9 }))
	ctx, cancel := context.WithDeadline(context.Background(), f.Now().Add(30*time.Second))
	defer cancel()
	n := 0
	err := p.Do(ctx, func(context.Context) error { n++; return overloaded() })
	oe, ok := outcome.As(err)
	if n != 1 || !ok || oe.Kind != outcome.DontRetry || oe.Reason != "no time left to retry" {
		t.Fatalf("%d attempts, err %v", n, err)
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	f := clock.NewFake(time.Now())
	p := mustNew(t, retry.WithClock(f), retry.WithoutThrottle(), retry.WithoutBudget(), retry.WithBackoff(0, 0))
	ctx, cancel := context.WithDeadline(context.Background(), f.Now().Add(30*time.Second))
	defer cancel()
	n := 0
	err := p.Do(ctx, func(context.Context) error {
		n++
		return &outcome.Error{Kind: outcome.TaskOverloaded, Downstream: true, RetryAfter: time.Minute}
	})
	if oe, ok := outcome.As(err); n != 1 || !ok || oe.RetryAfter != time.Minute || oe.Kind != outcome.DontRetry {
		t.Fatalf("%d attempts, err %v; a 1 min RetryAfter does not fit a 30 s deadline", n, err)
	}
}

func TestCancelDuringBackoff(t *testing.T) {
	f := clock.NewFake(epoch)
	p := mustNew(t, retry.WithClock(f), retry.WithoutThrottle(), retry.WithoutBudget())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Do(ctx, func(context.Context) error { return overloaded() }) }()
	stop := make(chan struct{})
	defer close(stop)
	f.BlockUntil(1, stop)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	if f.Pending() != 0 {
		t.Fatal("backoff timer left pending")
	}
}

func TestNewErrors(t *testing.T) {
	for _, opts := range [][]retry.Option{
		{retry.WithMaxAttempts(0)}, {retry.WithMaxAttempts(4)},
		{retry.WithBudget(0, time.Minute)}, {retry.WithBudget(1.5, time.Minute)}, {retry.WithBudget(0.1, time.Millisecond)},
		{retry.WithBackoff(-1, 0)}, {retry.WithBackoff(time.Second, time.Millisecond)},
	} {
		if _, err := retry.New(opts...); !errors.Is(err, retry.ErrConfig) {
			t.Errorf("New: err = %v", err)
		}
	}
	if _, err := retry.NewBudget(2, time.Minute, nil); !errors.Is(err, retry.ErrConfig) {
		t.Errorf("NewBudget: err = %v", err)
	}
}
