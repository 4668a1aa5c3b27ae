package intake_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/usage"
)

// recorder keeps what a Tracer is told, and the context's tag.
type recorder struct {
	mu     sync.Mutex
	events []intake.Event
	tags   []string
}

type tagKey struct{}

func (r *recorder) Trace(ctx context.Context, e *intake.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := *e
	ev.Header = nil
	if e.Header != nil {
		ev.Header = map[string][]string{"seen": nil}
	}
	r.events = append(r.events, ev)
	tag, _ := ctx.Value(tagKey{}).(string)
	r.tags = append(r.tags, tag)
}

func (r *recorder) last() (intake.Event, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.events) == 0 {
		return intake.Event{}, ""
	}
	return r.events[len(r.events)-1], r.tags[len(r.tags)-1]
}

// The Tracer is told each decision with the request's context: a refusal
// at Accept with the header (for a span's parent), an admission at Start
// with the wait for the slot (on the virtual clock), the CPU charged at
// Finish in the context TraceIn named.
func TestTracerIsToldEachDecision(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	ctl, err := admission.New(admission.WithClock(clk), admission.WithLimits(1, 1, 1), admission.WithMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := quota.New(quota.Config{Customers: map[string]quota.Limit{"a": {CPU: 100}}})
	u, _ := usage.New(usage.WithClock(clk))
	e, _ := quota.NewEnforcer(p, u)
	m, _ := cost.New(cost.WithClock(clk), cost.WithCPU(func() (time.Duration, error) { return 0, nil }))
	rec := &recorder{}
	in, err := intake.New(trustAll(t), intake.WithAdmission(ctl), intake.WithQuota(e, m), intake.WithTracer(rec))
	if err != nil {
		t.Fatal(err)
	}
	req := func(level string) *intake.Request {
		return &intake.Request{Peer: trusted, Path: "/svc/M", Header: map[string][]string{
			"triage-criticality": {level}, "triage-customer": {"a"}, "triage-attempt": {"1"}}}
	}
	accepted := context.WithValue(context.Background(), tagKey{}, "accept")

	holder, err := in.Accept(accepted, req("CRITICAL"))
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	ev, tag := rec.last()
	if ev.Kind != intake.Admitted || ev.Wait != 0 || ev.Level != criticality.Critical || ev.Attempt != 1 || ev.Customer != "a" || !ev.Trusted || ev.Path != "/svc/M" || tag != "accept" {
		t.Fatalf("the holder's admission: %+v in %q", ev, tag)
	}

	// A second request waits 10 ms for the holder's slot.
	waiter, err := in.Accept(accepted, req("CRITICAL_PLUS"))
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- waiter.Start() }()
	for ctl.Stats().Queued == 0 {
		runtime.Gosched()
	}
	clk.Advance(10 * time.Millisecond)
	holder.TraceIn(context.WithValue(context.Background(), tagKey{}, "handler"))
	holder.Finish()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	// The holder's charge and the waiter's admission, in either order:
	// the waiter's goroutine takes the slot as the holder's Finish
	// releases it, before or after the charge is told.
	rec.mu.Lock()
	got := map[intake.EventKind]string{}
	for i := 1; i < len(rec.events) && i < 3; i++ {
		got[rec.events[i].Kind] = fmt.Sprintf("%q after %v", rec.tags[i], rec.events[i].Wait)
	}
	rec.mu.Unlock()
	if want := `"handler" after 0s`; got[intake.Charged] != want {
		t.Errorf("the holder's charge: %q, want %s", got[intake.Charged], want)
	}
	if want := `"accept" after 10ms`; got[intake.Admitted] != want {
		t.Errorf("the waiter's admission: %q, want %s", got[intake.Admitted], want)
	}
	waiter.Finish()

	// Shed at arrival: refused at Accept, with the header.
	if err := ctl.ForceShed(criticality.Sheddable, 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Accept(accepted, req("SHEDDABLE")); err == nil {
		t.Fatal("a SHEDDABLE request admitted during the drill")
	}
	ev, tag = rec.last()
	if ev.Kind != intake.Refused || ev.Err == nil || ev.Header == nil || ev.Level != criticality.Sheddable || tag != "accept" {
		t.Errorf("the refusal: %+v in %q", ev, tag)
	}
}
