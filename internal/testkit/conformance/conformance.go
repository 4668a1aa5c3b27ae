// Package conformance is the conformance table: requests, each sent to
// every transport triage serves (gRPC and net/http servers, the sidecar,
// the Envoy processor) configured alike, and what each must do with it:
// the same outcome, and the same criticality, attempt, customer, client
// type, decay, deadline and triage keys where the request is handled. The
// table lives here once; each transport's test sends its rows.
package conformance

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/usage"
	"github.com/triagehq/triage/trust"
)

// Seen is what a handler saw, or the outcome that answered the request.
type Seen struct {
	Outcome    outcome.Kind // 0: the handler ran
	Level      criticality.Level
	Attempt    int
	Customer   string
	ClientType string
	DecayTo    string        // "" without a decay
	DecayIn    time.Duration // rounded to the second
	Deadline   time.Duration // rounded to the second; 0 without one
	TriageKeys []string      // triage keys the handler could read, lower case
}

func (s Seen) String() string {
	if s.Outcome != 0 {
		return "refused " + s.Outcome.Token()
	}
	return fmt.Sprintf("%v attempt=%d customer=%q client=%q decay=%s/%v deadline=%v keys=%v",
		s.Level, s.Attempt, s.Customer, s.ClientType, s.DecayTo, s.DecayIn, s.Deadline, s.TriageKeys)
}

// Row is one request of the table and what must come of it.
type Row struct {
	Name    string
	Trusted bool        // sent from the trusted address
	Path    string      // the URL path or gRPC method
	Host    string      // the Host or :authority; "" for the transport's own
	Header  [][2]string // lower-case keys; sent in this spelling on gRPC, canonicalized by net/http
	Want    Seen
}

// Setup is the configuration every transport's server gets: trustedIP
// trusted; header, path and group rules; two client types by host, one of
// them black-holed; a customer over a hard quota; and an admission
// controller whose utilization signal sheds SHEDDABLE and nothing else.
// The controller comes apart from the intake options, since an HTTP
// transport takes it with its own option (it also gates the run queue).
func Setup(t testing.TB, trustedIP string) ([]intake.Option, *admission.Controller) {
	t.Helper()
	pol := trust.MustNew(trust.Config{Networks: []string{trustedIP + "/32"}})
	cl := edge.MustNew(edge.Config{Rules: []edge.RuleConfig{
		{Header: true},
		{PathPrefix: "/checkout", Criticality: "CRITICAL_PLUS"},
		{PathPrefix: "/feed", Criticality: "SHEDDABLE_PLUS", Decay: &edge.DecayConfig{After: "10m", To: "SHEDDABLE"}},
		{PathPrefix: "/search", Criticality: "CRITICAL", Decay: &edge.DecayConfig{After: "5s", To: "cancel"}},
		{Group: "free", Criticality: "SHEDDABLE_PLUS"},
	}})
	iso, err := isolate.New(isolate.Config{Clients: []isolate.Client{
		{Name: "maps", Hosts: []string{"maps.example"}},
		{Name: "rogue", Hosts: []string{"rogue.example"}, Route: "black-hole"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := quota.New(quota.Config{Default: quota.Limit{CPU: 100}, Customers: map[string]quota.Limit{"broke": {CPU: 0, Hard: true}}})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := usage.New()
	e, err := quota.NewEnforcer(qp, u)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := cost.New()
	// A utilization signal at 0.5 whose thresholds shed SHEDDABLE only:
	// admission refuses every SHEDDABLE request and admits the rest.
	var th admission.Thresholds
	for l, s := range [criticality.NumLevels]float64{0.1, 0.6, 0.8, 0.9} {
		th.Start[l], th.End[l] = s, s+0.1
	}
	ctl, err := admission.New(admission.WithSignal(fixedSignal(0.5), th))
	if err != nil {
		t.Fatal(err)
	}
	return []intake.Option{intake.WithTrust(pol), intake.WithClassifier(cl), intake.WithIsolation(iso), intake.WithQuota(e, m)}, ctl
}

type fixedSignal float64

func (fixedSignal) Name() string           { return "fixed" }
func (s fixedSignal) Utilization() float64 { return float64(s) }

var Rows = []Row{
	{Name: "untrusted, no keys", Path: "/x/y", Want: Seen{Level: criticality.Critical}},
	{Name: "untrusted spoofs every key", Path: "/x/y", Header: [][2]string{
		{"triage-criticality", "CRITICAL_PLUS"}, {"triage-attempt", "2"}, {"triage-customer", "acme"},
		{"triage-criticality-decay", "1000:SHEDDABLE"}, {"triage-unregistered", "x"}, {"x-other", "kept"}},
		Want: Seen{Level: criticality.Critical}},
	{Name: "untrusted spoofs in upper case", Path: "/x/y", Header: [][2]string{{"TRIAGE-CRITICALITY", "CRITICAL_PLUS"}},
		Want: Seen{Level: criticality.Critical}},
	// The hostile-peer spellings (issue 21): none changes how an untrusted
	// caller's request is treated, and none reaches the handler.
	{Name: "untrusted underscore spellings", Path: "/x/y", Header: [][2]string{
		{"triage_criticality", "CRITICAL_PLUS"}, {"triage_customer", "acme"}, {"triage_attempt", "2"}, {"triage-criticality_decay", "1:SHEDDABLE"}},
		Want: Seen{Level: criticality.Critical}},
	{Name: "untrusted -bin key", Path: "/x/y", Header: [][2]string{{"triage-criticality-bin", "CRITICAL_PLUS"}},
		Want: Seen{Level: criticality.Critical}},
	{Name: "untrusted duplicates", Path: "/x/y", Header: [][2]string{
		{"triage-criticality", "CRITICAL_PLUS"}, {"triage-criticality", "CRITICAL_PLUS"}, {"triage-customer", "a"}, {"triage-customer", "b"}},
		Want: Seen{Level: criticality.Critical}},
	{Name: "untrusted oversize values", Path: "/x/y", Header: [][2]string{
		{"triage-criticality", strings.Repeat("CRITICAL_PLUS", 600)}, {"triage-customer", strings.Repeat("a", 7000)}},
		Want: Seen{Level: criticality.Critical}},
	{Name: "untrusted thousands of triage keys", Path: "/x/y", Header: manyKeys(500), Want: Seen{Level: criticality.Critical}},
	{Name: "trusted underscore spelling dropped, not believed", Trusted: true, Path: "/x/y", Header: [][2]string{
		{"triage_criticality", "SHEDDABLE"}, {"triage_customer", "acme"}},
		Want: Seen{Level: criticality.Critical}},
	{Name: "trusted oversize values ignored", Trusted: true, Path: "/x/y", Header: [][2]string{
		{"triage-criticality", strings.Repeat("S", 200)}, {"triage-customer", strings.Repeat("a", 65)}},
		Want: Seen{Level: criticality.Critical, TriageKeys: []string{"triage-criticality", "triage-customer"}}},
	{Name: "trusted keys believed", Trusted: true, Path: "/x/y", Header: [][2]string{
		{"triage-criticality", "SHEDDABLE_PLUS"}, {"triage-attempt", "2"}, {"triage-customer", "acme"}},
		Want: Seen{Level: criticality.SheddablePlus, Attempt: 2, Customer: "acme",
			TriageKeys: []string{"triage-attempt", "triage-criticality", "triage-customer"}}},
	{Name: "trusted repeated key ignored", Trusted: true, Path: "/x/y", Header: [][2]string{
		{"triage-criticality", "SHEDDABLE_PLUS"}, {"triage-criticality", "CRITICAL_PLUS"}},
		Want: Seen{Level: criticality.Critical, TriageKeys: []string{"triage-criticality"}}},
	{Name: "trusted malformed customer ignored", Trusted: true, Path: "/x/y", Header: [][2]string{{"triage-customer", "a b"}},
		Want: Seen{Level: criticality.Critical, TriageKeys: []string{"triage-customer"}}},
	{Name: "trusted decay from upstream", Trusted: true, Path: "/x/y", Header: [][2]string{
		{"triage-criticality", "SHEDDABLE_PLUS"}, {"triage-criticality-decay", "60000:SHEDDABLE"}},
		Want: Seen{Level: criticality.SheddablePlus, DecayTo: "SHEDDABLE", DecayIn: time.Minute,
			TriageKeys: []string{"triage-criticality", "triage-criticality-decay"}}},
	{Name: "trusted decay already past", Trusted: true, Path: "/x/y", Header: [][2]string{
		{"triage-criticality", "CRITICAL"}, {"triage-criticality-decay", "0:SHEDDABLE_PLUS"}},
		Want: Seen{Level: criticality.SheddablePlus, DecayTo: "SHEDDABLE_PLUS",
			TriageKeys: []string{"triage-criticality", "triage-criticality-decay"}}},
	{Name: "path rule", Path: "/checkout/pay", Want: Seen{Level: criticality.CriticalPlus}},
	{Name: "path rule matches whole segments", Path: "/checkoutx/y", Want: Seen{Level: criticality.Critical}},
	{Name: "path rule with decay to a level", Path: "/feed/top",
		Want: Seen{Level: criticality.SheddablePlus, DecayTo: "SHEDDABLE", DecayIn: 10 * time.Minute}},
	{Name: "path rule with decay to cancel", Path: "/search/q",
		Want: Seen{Level: criticality.Critical, Deadline: 5 * time.Second}},
	{Name: "group rule", Path: "/x/y", Header: [][2]string{{"x-plan", "free"}}, Want: Seen{Level: criticality.SheddablePlus}},
	{Name: "isolation names the client type", Path: "/x/y", Host: "maps.example",
		Want: Seen{Level: criticality.Critical, ClientType: "maps"}},
	{Name: "isolation black hole", Path: "/checkout/pay", Host: "rogue.example", Want: Seen{Outcome: outcome.DontRetry}},
	{Name: "quota refuses a customer over a hard limit", Trusted: true, Path: "/x/y", Header: [][2]string{{"triage-customer", "broke"}},
		Want: Seen{Outcome: outcome.OutOfQuota}},
	{Name: "admission refuses SHEDDABLE", Trusted: true, Path: "/x/y", Header: [][2]string{{"triage-criticality", "SHEDDABLE"}},
		Want: Seen{Outcome: outcome.TaskOverloaded}},
	{Name: "health check outside admission", Trusted: true, Path: "/grpc.health.v1.Health/Check",
		Header: [][2]string{{"triage-criticality", "SHEDDABLE"}},
		Want:   Seen{Level: criticality.Sheddable, TriageKeys: []string{"triage-criticality"}}},
	{Name: "health check outside isolation", Path: "/grpc.health.v1.Health/Check", Host: "rogue.example",
		Want: Seen{Level: criticality.Critical}},
	{Name: "not a health check: another method of its service", Trusted: true, Path: "/grpc.health.v1.Health/Other",
		Header: [][2]string{{"triage-criticality", "SHEDDABLE"}}, Want: Seen{Outcome: outcome.TaskOverloaded}},
}

// manyKeys is n distinct triage keys.
func manyKeys(n int) [][2]string {
	out := make([][2]string, n)
	for i := range out {
		out[i] = [2]string{fmt.Sprintf("triage-k%d", i), "CRITICAL_PLUS"}
	}
	return out
}

// Recorder is the handler side: what the last request saw.
type Recorder struct {
	mu   sync.Mutex
	last Seen
}

func (r *Recorder) Record(ctx context.Context, keys []string) {
	s := Seen{
		Level:      criticality.Of(ctx),
		Attempt:    attempt.Incoming(ctx),
		Customer:   quota.CustomerOf(ctx),
		ClientType: isolate.ClientOf(ctx),
	}
	now := time.Now()
	if d, ok := criticality.DecayOf(ctx); ok {
		s.DecayTo, s.DecayIn = d.To.String(), d.At.Sub(now).Round(time.Second)
		if s.DecayIn < 0 {
			s.DecayIn = 0
		}
	}
	if d, ok := ctx.Deadline(); ok {
		s.Deadline = d.Sub(now).Round(time.Second)
	}
	for _, k := range keys {
		if strings.HasPrefix(strings.ToLower(k), "triage-") {
			s.TriageKeys = append(s.TriageKeys, strings.ToLower(k))
		}
	}
	slices.Sort(s.TriageKeys)
	r.mu.Lock()
	r.last = s
	r.mu.Unlock()
}

func (r *Recorder) Take() Seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.last
	r.last = Seen{}
	return s
}

// WithoutCallDeadline drops the gRPC client's own 10 s call deadline,
// which the HTTP client does not send: a shorter one (a rule's cancel)
// is kept.
func WithoutCallDeadline(d time.Duration) time.Duration {
	if d > 9*time.Second {
		return 0
	}
	return d
}
