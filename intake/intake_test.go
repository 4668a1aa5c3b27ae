package intake_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/usage"
	"github.com/triagehq/triage/trust"
)

type fixedSignal float64

func (fixedSignal) Name() string           { return "fixed" }
func (s fixedSignal) Utilization() float64 { return float64(s) }

var trusted = trust.Peer{Addr: netip.MustParseAddr("127.0.0.1")}

func trustAll(t *testing.T) intake.Option {
	t.Helper()
	return intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"0.0.0.0/0", "::/0"}}))
}

// A refusal allocates nothing in the intake: under heavy overload most
// requests are refused, and the refusal path must stay cheap.
func TestRefusalAllocatesNothing(t *testing.T) {
	ctl, err := admission.New(admission.WithSignal(fixedSignal(2), admission.DefaultThresholds()))
	if err != nil {
		t.Fatal(err)
	}
	in, err := intake.New(intake.WithAdmission(ctl))
	if err != nil {
		t.Fatal(err)
	}
	header := map[string][]string{"triage-criticality": {"CRITICAL_PLUS"}}
	ctx := context.Background()
	var refused error
	allocs := testing.AllocsPerRun(1000, func() {
		r := intake.Request{Path: "/svc/M", Header: header}
		_, refused = in.Accept(ctx, &r)
	})
	if refused == nil {
		t.Fatal("admitted at twice the signal's target")
	}
	if _, _, ok := admission.RejectionOf(refused); !ok {
		t.Fatalf("refused with %v, want an admission rejection", refused)
	}
	if allocs != 0 {
		t.Errorf("a refusal allocates %v times, want 0", allocs)
	}
}

// A request whose Start fails (its caller went away while it waited for
// a slot) gives back what it reserved from its customer's pessimistic
// budget: otherwise requests that never ran would use the customer's
// quota up.
func TestStartFailureGivesBackTheQuotaReservation(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	p, err := quota.New(quota.Config{Customers: map[string]quota.Limit{"a": {CPU: 1, Hard: true}}})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := usage.New(usage.WithClock(clk))
	e, err := quota.NewEnforcer(p, u, quota.WithMode(quota.ModePessimistic), quota.WithHeadroom(0))
	if err != nil {
		t.Fatal(err)
	}
	r0, err := e.Reserve("a", criticality.Critical) // a new budget starts empty
	if err != nil {
		t.Fatal(err)
	}
	e.Cancel("a", r0)
	clk.Advance(time.Second) // it fills for a second: tens of 1 ms reservations
	ctl, err := admission.New(admission.WithClock(clk), admission.WithLimits(1, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := cost.New(cost.WithClock(clk))
	in, err := intake.New(trustAll(t), intake.WithAdmission(ctl), intake.WithQuota(e, m), intake.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	req := func() *intake.Request {
		return &intake.Request{Peer: trusted, Path: "/svc/M", Header: map[string][]string{"triage-customer": {"a"}}}
	}
	holder, err := in.Accept(context.Background(), req())
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil { // holds the only execution slot
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 500 {
		h, err := in.Accept(gone, req())
		if err != nil {
			t.Fatalf("request %d refused: %v (reservations of requests that never ran were not given back)", i, err)
		}
		if err := h.Start(); err == nil {
			t.Fatalf("request %d started with the only slot held", i)
		}
	}
	holder.Finish()
}

// A customer named by the peer's identity is held to the length a
// propagated customer may have (wire.CustomerMaxLen), so that the next
// hop, which reads it from triage-customer, accounts it under the same
// name (issue 21, item 10).
func TestIdentityCustomerFitsThePropagatedLength(t *testing.T) {
	in, err := intake.New(intake.WithCustomerFromIdentity())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ id, want string }{
		{"spiffe://prod/svc/frontend", "spiffe://prod/svc/frontend"},
		{"spiffe://prod/" + strings.Repeat("x", 100), ""},
	} {
		r := intake.Request{Path: "/svc/M", Peer: trust.Peer{Identities: []string{tc.id}}, Header: map[string][]string{}}
		h, err := in.Accept(context.Background(), &r)
		if err != nil {
			t.Fatal(err)
		}
		if got := quota.CustomerOf(h); got != tc.want {
			t.Errorf("identity of %d bytes: customer %q, want %q", len(tc.id), got, tc.want)
		}
		h.Finish()
	}
}

// A wait on the client that lasts the target delay stalls the request
// (its slot and room go back) until it ends; a shorter one changes
// nothing; after the first, waits allocate nothing; a request without
// admission control is not wrapped for them.
func TestClientWaitStallsOnlyWaitsPastTheTargetDelay(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	ctl, err := admission.New(admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	in, err := intake.New(intake.WithAdmission(ctl), intake.WithClock(f))
	if err != nil {
		t.Fatal(err)
	}
	h, err := in.Accept(context.Background(), &intake.Request{Path: "/svc/M"})
	if err != nil {
		t.Fatal(err)
	}
	if !h.UnderAdmission() {
		t.Fatal("an admitted request says it is not under admission control")
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	d := ctl.TargetDelay()
	h.ClientWait(intake.Own)
	f.Advance(d - 1)
	h.ClientResume(intake.Own)
	f.Advance(time.Hour) // the stopped timer does nothing
	if s := ctl.Stats(); s.Stalled != 0 || s.Executing != 1 {
		t.Fatalf("after a wait shorter than the target delay: %+v", s)
	}
	h.ClientWait(intake.Own)
	f.Advance(d)
	if s := ctl.Stats(); s.Stalled != 1 || s.Executing != 0 || s.Pending != 0 {
		t.Fatalf("after a wait of the target delay: %+v", s)
	}
	h.ClientResume(intake.Own)
	if s := ctl.Stats(); s.Stalled != 0 || s.Executing != 1 {
		t.Fatalf("after the wait: %+v", s)
	}
	h.ClientWait(intake.Own)
	f.Advance(d)
	h.Finish() // ends while stalled: its client went away
	f.Advance(time.Hour)
	if s := ctl.Stats(); s.Stalled != 0 || s.Executing != 0 || s.Pending != 0 {
		t.Fatalf("after Finish while stalled: %+v", s)
	}

	// On the real clock (the fake one allocates as it schedules).
	realCtl, err := admission.New()
	if err != nil {
		t.Fatal(err)
	}
	real, err := intake.New(intake.WithAdmission(realCtl))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := real.Accept(context.Background(), &intake.Request{Path: "/svc/M"})
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	r.ClientWait(intake.Own)
	r.ClientResume(intake.Own)
	allocs := testing.AllocsPerRun(100, func() {
		r.ClientWait(intake.Own)
		r.ClientResume(intake.Own)
	})
	r.Finish()
	if allocs != 0 {
		t.Errorf("a wait on the client allocates %v times, want 0", allocs)
	}

	plain, err := intake.New()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := plain.Accept(context.Background(), &intake.Request{Path: "/svc/M"})
	if p.UnderAdmission() {
		t.Fatal("a request without admission control says it is under it")
	}
	p.ClientWait(intake.Own) // does nothing
	p.ClientResume(intake.Own)
}

// A request is stalled only while every goroutine of it that has waited
// on its client, its own among them, waits: a goroutine reading the
// client while the handler's own works does not free the slot.
func TestClientWaitStallsOnlyWhenEveryGoroutineWaits(t *testing.T) {
	in, ctl, f := admittedIntake(t, 1)
	h := started(t, in, &intake.Request{Path: "/svc/M"})
	const reader = 7 // another goroutine's id
	d := ctl.TargetDelay()
	h.ClientWait(reader) // the reader waits for the client's next message
	f.Advance(10 * d)    // while the handler's own goroutine works
	if s := ctl.Stats(); s.Stalled != 0 || s.Executing != 1 {
		t.Fatalf("a reader goroutine waits while the handler works: %+v, want the slot held", s)
	}
	h.ClientWait(intake.Own) // the handler's own send blocks too
	f.Advance(d - 1)
	if s := ctl.Stats(); s.Stalled != 0 {
		t.Fatalf("every goroutine waiting for less than the target delay: %+v", s)
	}
	f.Advance(1)
	if s := ctl.Stats(); s.Stalled != 1 || s.Executing != 0 {
		t.Fatalf("every goroutine waiting for the target delay: %+v, want stalled", s)
	}
	h.ClientResume(reader) // a message came: the reader works
	if s := ctl.Stats(); s.Stalled != 0 || s.Executing != 1 {
		t.Fatalf("the reader resumed: %+v, want the slot back", s)
	}
	f.Advance(10 * d)
	if s := ctl.Stats(); s.Stalled != 0 {
		t.Fatalf("the handler waits, the reader works: %+v, want the slot held", s)
	}
	h.ClientResume(intake.Own)
	h.Finish()
	if s := ctl.Stats(); s.Stalled != 0 || s.Executing != 0 || s.Pending != 0 {
		t.Fatalf("after Finish: %+v", s)
	}
}

// Own's waits nest (issue 55): a proxy's wait on its upstream that is a
// wait on its client, and its writer's flush from another goroutine, both
// wait as Own; the flush's end does not end the other wait, so the
// request still stalls; it resumes when the last of them ends.
func TestOwnWaitsNest(t *testing.T) {
	in, ctl, f := admittedIntake(t, 1)
	h := started(t, in, &intake.Request{Path: "/svc/M"})
	d := ctl.TargetDelay()
	h.ClientWait(intake.Own)   // the wait on the upstream
	h.ClientWait(intake.Own)   // a flush
	h.ClientResume(intake.Own) // the flush is done
	f.Advance(d)
	if s := ctl.Stats(); s.Stalled != 1 || s.Executing != 0 {
		t.Fatalf("one of Own's two waits ended, the other on for the target delay: %+v, want stalled", s)
	}
	h.ClientResume(intake.Own)
	if s := ctl.Stats(); s.Stalled != 0 || s.Executing != 1 {
		t.Fatalf("both ended: %+v, want the slot back", s)
	}
	f.Advance(10 * d)
	if s := ctl.Stats(); s.Stalled != 0 {
		t.Fatalf("no wait: %+v", s)
	}
	h.Finish()
}

// A connection's stalled requests are bounded (WithMaxConnStalls): past
// the bound, a request waiting on its client keeps its slot.
func TestConnStallsBoundsAConnectionsStalls(t *testing.T) {
	in, ctl, f := admittedIntake(t, 4, intake.WithMaxConnStalls(2))
	conn := new(intake.Conn)
	var hs []*intake.Handle
	for range 3 {
		h := started(t, in, &intake.Request{Path: "/svc/M", Conn: conn})
		h.ClientWait(intake.Own)
		hs = append(hs, h)
	}
	f.Advance(ctl.TargetDelay())
	if s := ctl.Stats(); s.Stalled != 2 || s.Executing != 1 || intake.Stalled(conn) != 2 {
		t.Fatalf("3 requests of a connection bounded to 2 stalls waiting: %+v, connection %d", s, intake.Stalled(conn))
	}
	for _, h := range hs {
		h.Finish()
	}
	if s := ctl.Stats(); s.Stalled != 0 || s.Executing != 0 || intake.Stalled(conn) != 0 {
		t.Fatalf("after Finish: %+v, connection %d", s, intake.Stalled(conn))
	}
}

// admittedIntake returns an Intake with admission control at a limit of
// limit on a fake clock.
func admittedIntake(t *testing.T, limit int, opts ...intake.Option) (*intake.Intake, *admission.Controller, *clock.Fake) {
	t.Helper()
	f := clock.NewFake(time.Unix(0, 0))
	ctl, err := admission.New(admission.WithClock(f), admission.WithLimits(limit, limit, limit), admission.WithInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	in, err := intake.New(append([]intake.Option{intake.WithAdmission(ctl), intake.WithClock(f)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return in, ctl, f
}

// started accepts a request through in and starts it.
func started(t *testing.T, in *intake.Intake, r *intake.Request) *intake.Handle {
	t.Helper()
	h, err := in.Accept(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	return h
}

// Time is set once, on the admission controller: an Intake without a
// clock of its own starts decays on the controller's, and a clock other
// than the controller's is refused.
func TestIntakeTakesTheControllersClock(t *testing.T) {
	f := clock.NewFake(time.Unix(1000, 0))
	ctl, err := admission.New(admission.WithClock(f))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := intake.New(intake.WithAdmission(ctl), intake.WithClock(clock.NewFake(time.Unix(0, 0)))); err == nil {
		t.Fatal("an Intake took a clock other than its controller's")
	}
	cl := edge.MustNew(edge.Config{Rules: []edge.RuleConfig{{PathPrefix: "/", Criticality: "CRITICAL", Decay: &edge.DecayConfig{After: "2s", To: "SHEDDABLE"}}}})
	in, err := intake.New(intake.WithAdmission(ctl), intake.WithClassifier(cl))
	if err != nil {
		t.Fatal(err)
	}
	h, err := in.Accept(context.Background(), &intake.Request{Path: "/x", Header: map[string][]string{}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Abandon()
	d, ok := criticality.DecayOf(h)
	if !ok || !d.At.Equal(f.Now().Add(2*time.Second)) {
		t.Fatalf("decay %+v %v, want at the controller's clock + 2s (%v)", d, ok, f.Now().Add(2*time.Second))
	}
}

// Behind a mesh's sidecar the intake believes the caller its proxy names
// in x-forwarded-client-cert (trust.Forwarders), in both header
// spellings: its criticality, and its identity as the customer; the same
// header from a peer that is not a forwarder changes nothing.
func TestForwardedCallerThroughATrustedProxy(t *testing.T) {
	pol := trust.MustNew(trust.Config{
		Identities: []string{"spiffe://cluster.local/ns/shop/sa/frontend"},
		Forwarders: trust.Forwarders{Networks: []string{"127.0.0.6/32"}},
	})
	in, err := intake.New(intake.WithTrust(pol), intake.WithCustomerFromIdentity())
	if err != nil {
		t.Fatal(err)
	}
	const xfcc = `By=spiffe://cluster.local/ns/shop/sa/shop;Hash=00;Subject="";URI=spiffe://cluster.local/ns/shop/sa/frontend`
	proxy, stranger := netip.MustParseAddr("127.0.0.6"), netip.MustParseAddr("10.0.0.9")
	for _, tc := range []struct {
		name     string
		peer     netip.Addr
		header   map[string][]string
		hc       intake.HeaderCase
		level    criticality.Level
		customer string
	}{
		{"gRPC metadata", proxy, map[string][]string{"x-forwarded-client-cert": {xfcc}, "triage-criticality": {"CRITICAL_PLUS"}}, intake.LowerCase, criticality.CriticalPlus, "spiffe://cluster.local/ns/shop/sa/frontend"},
		{"an HTTP header", proxy, map[string][]string{"X-Forwarded-Client-Cert": {xfcc}, "Triage-Criticality": {"CRITICAL_PLUS"}}, intake.Canonical, criticality.CriticalPlus, "spiffe://cluster.local/ns/shop/sa/frontend"},
		{"from a stranger", stranger, map[string][]string{"x-forwarded-client-cert": {xfcc}, "triage-criticality": {"CRITICAL_PLUS"}}, intake.LowerCase, criticality.Default, ""},
		{"the proxy without the header", proxy, map[string][]string{"triage-criticality": {"CRITICAL_PLUS"}}, intake.LowerCase, criticality.Default, ""},
	} {
		r := intake.Request{Path: "/svc/M", Peer: trust.Peer{Addr: tc.peer}, Header: tc.header, Case: tc.hc}
		h, err := in.Accept(context.Background(), &r)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := criticality.FromContext(h); got != tc.level {
			t.Errorf("%s: level %v, want %v", tc.name, got, tc.level)
		}
		if got := quota.CustomerOf(h); got != tc.customer {
			t.Errorf("%s: customer %q, want %q", tc.name, got, tc.customer)
		}
		h.Finish()
	}
}

// A wait on the client that ended leaves no timer armed: firing after it,
// once a request, the timer would start a goroutine to find nothing to
// stall. A wait that begins again arms it again.
func TestEndedClientWaitLeavesNoTimer(t *testing.T) {
	in, ctl, f := admittedIntake(t, 1)
	h := started(t, in, &intake.Request{Path: "/svc/M"})
	const reader = 7 // another goroutine's id
	before := f.Pending()
	for _, wait := range []struct {
		name string
		end  func()
	}{
		{"resumed", func() { h.ClientResume(intake.Own) }},
		{"done", func() { h.ClientDone(intake.Own) }},
	} {
		h.ClientWait(intake.Own)
		if got := f.Pending(); got != before+1 {
			t.Fatalf("a wait on the client arms %d timers, want 1", got-before)
		}
		wait.end()
		if got := f.Pending(); got != before {
			t.Errorf("a wait %s: %d timers still armed, want none", wait.name, got-before)
		}
	}
	h.ClientWait(reader) // the reader waits; the handler works
	h.ClientWait(intake.Own)
	h.ClientDone(reader) // the reader read to the end: the handler alone waits on
	f.Advance(ctl.TargetDelay())
	if s := ctl.Stats(); s.Stalled != 1 {
		t.Fatalf("the handler's wait after the reader's ended: %+v, want it stalled", s)
	}
	h.ClientResume(intake.Own)
	h.Finish()
}
