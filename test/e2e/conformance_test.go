package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
)

// The conformance table: every row is one request, sent over loopback to
// a gRPC server and to an HTTP server that are configured alike (the same
// trust, rules, isolation, quotas and admission), and the two must treat
// it identically: the same outcome, and the same criticality, attempt,
// customer, client type, decay, deadline and triage keys at the handler.

// seen is what a handler saw, or the outcome that answered the request.
type seen struct {
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

func (s seen) String() string {
	if s.Outcome != 0 {
		return "refused " + s.Outcome.Token()
	}
	return fmt.Sprintf("%v attempt=%d customer=%q client=%q decay=%s/%v deadline=%v keys=%v",
		s.Level, s.Attempt, s.Customer, s.ClientType, s.DecayTo, s.DecayIn, s.Deadline, s.TriageKeys)
}

type conformanceRow struct {
	name    string
	trusted bool
	path    string
	host    string
	header  [][2]string // lower-case keys; sent in this spelling on gRPC, canonicalized by net/http
	want    seen
}

func conformancePolicy(t *testing.T) (*trust.Policy, *edge.Classifier, *isolate.Table, *quota.Enforcer, *cost.Meter, *admission.Controller) {
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
	u, _ := quota.NewUsage()
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
	return pol, cl, iso, e, m, ctl
}

type fixedSignal float64

func (fixedSignal) Name() string           { return "fixed" }
func (s fixedSignal) Utilization() float64 { return float64(s) }

var conformanceRows = []conformanceRow{
	{name: "untrusted, no keys", path: "/x/y", want: seen{Level: criticality.Critical}},
	{name: "untrusted spoofs every key", path: "/x/y", header: [][2]string{
		{"triage-criticality", "CRITICAL_PLUS"}, {"triage-attempt", "2"}, {"triage-customer", "acme"},
		{"triage-criticality-decay", "1000:SHEDDABLE"}, {"triage-unregistered", "x"}, {"x-other", "kept"}},
		want: seen{Level: criticality.Critical}},
	{name: "untrusted spoofs in upper case", path: "/x/y", header: [][2]string{{"TRIAGE-CRITICALITY", "CRITICAL_PLUS"}},
		want: seen{Level: criticality.Critical}},
	// The hostile-peer spellings (issue 21): none changes how an untrusted
	// caller's request is treated, and none reaches the handler.
	{name: "untrusted underscore spellings", path: "/x/y", header: [][2]string{
		{"triage_criticality", "CRITICAL_PLUS"}, {"triage_customer", "acme"}, {"triage_attempt", "2"}, {"triage-criticality_decay", "1:SHEDDABLE"}},
		want: seen{Level: criticality.Critical}},
	{name: "untrusted -bin key", path: "/x/y", header: [][2]string{{"triage-criticality-bin", "CRITICAL_PLUS"}},
		want: seen{Level: criticality.Critical}},
	{name: "untrusted duplicates", path: "/x/y", header: [][2]string{
		{"triage-criticality", "CRITICAL_PLUS"}, {"triage-criticality", "CRITICAL_PLUS"}, {"triage-customer", "a"}, {"triage-customer", "b"}},
		want: seen{Level: criticality.Critical}},
	{name: "untrusted oversize values", path: "/x/y", header: [][2]string{
		{"triage-criticality", strings.Repeat("CRITICAL_PLUS", 600)}, {"triage-customer", strings.Repeat("a", 7000)}},
		want: seen{Level: criticality.Critical}},
	{name: "untrusted thousands of triage keys", path: "/x/y", header: manyKeys(500), want: seen{Level: criticality.Critical}},
	{name: "trusted underscore spelling dropped, not believed", trusted: true, path: "/x/y", header: [][2]string{
		{"triage_criticality", "SHEDDABLE"}, {"triage_customer", "acme"}},
		want: seen{Level: criticality.Critical}},
	{name: "trusted oversize values ignored", trusted: true, path: "/x/y", header: [][2]string{
		{"triage-criticality", strings.Repeat("S", 200)}, {"triage-customer", strings.Repeat("a", 65)}},
		want: seen{Level: criticality.Critical, TriageKeys: []string{"triage-criticality", "triage-customer"}}},
	{name: "trusted keys believed", trusted: true, path: "/x/y", header: [][2]string{
		{"triage-criticality", "SHEDDABLE_PLUS"}, {"triage-attempt", "2"}, {"triage-customer", "acme"}},
		want: seen{Level: criticality.SheddablePlus, Attempt: 2, Customer: "acme",
			TriageKeys: []string{"triage-attempt", "triage-criticality", "triage-customer"}}},
	{name: "trusted repeated key ignored", trusted: true, path: "/x/y", header: [][2]string{
		{"triage-criticality", "SHEDDABLE_PLUS"}, {"triage-criticality", "CRITICAL_PLUS"}},
		want: seen{Level: criticality.Critical, TriageKeys: []string{"triage-criticality"}}},
	{name: "trusted malformed customer ignored", trusted: true, path: "/x/y", header: [][2]string{{"triage-customer", "a b"}},
		want: seen{Level: criticality.Critical, TriageKeys: []string{"triage-customer"}}},
	{name: "trusted decay from upstream", trusted: true, path: "/x/y", header: [][2]string{
		{"triage-criticality", "SHEDDABLE_PLUS"}, {"triage-criticality-decay", "60000:SHEDDABLE"}},
		want: seen{Level: criticality.SheddablePlus, DecayTo: "SHEDDABLE", DecayIn: time.Minute,
			TriageKeys: []string{"triage-criticality", "triage-criticality-decay"}}},
	{name: "trusted decay already past", trusted: true, path: "/x/y", header: [][2]string{
		{"triage-criticality", "CRITICAL"}, {"triage-criticality-decay", "0:SHEDDABLE_PLUS"}},
		want: seen{Level: criticality.SheddablePlus, DecayTo: "SHEDDABLE_PLUS",
			TriageKeys: []string{"triage-criticality", "triage-criticality-decay"}}},
	{name: "path rule", path: "/checkout/pay", want: seen{Level: criticality.CriticalPlus}},
	{name: "path rule matches whole segments", path: "/checkoutx/y", want: seen{Level: criticality.Critical}},
	{name: "path rule with decay to a level", path: "/feed/top",
		want: seen{Level: criticality.SheddablePlus, DecayTo: "SHEDDABLE", DecayIn: 10 * time.Minute}},
	{name: "path rule with decay to cancel", path: "/search/q",
		want: seen{Level: criticality.Critical, Deadline: 5 * time.Second}},
	{name: "group rule", path: "/x/y", header: [][2]string{{"x-plan", "free"}}, want: seen{Level: criticality.SheddablePlus}},
	{name: "isolation names the client type", path: "/x/y", host: "maps.example",
		want: seen{Level: criticality.Critical, ClientType: "maps"}},
	{name: "isolation black hole", path: "/checkout/pay", host: "rogue.example", want: seen{Outcome: outcome.DontRetry}},
	{name: "quota refuses a customer over a hard limit", trusted: true, path: "/x/y", header: [][2]string{{"triage-customer", "broke"}},
		want: seen{Outcome: outcome.OutOfQuota}},
	{name: "admission refuses SHEDDABLE", trusted: true, path: "/x/y", header: [][2]string{{"triage-criticality", "SHEDDABLE"}},
		want: seen{Outcome: outcome.TaskOverloaded}},
	{name: "health check outside admission", trusted: true, path: "/grpc.health.v1.Health/Check",
		header: [][2]string{{"triage-criticality", "SHEDDABLE"}},
		want:   seen{Level: criticality.Sheddable, TriageKeys: []string{"triage-criticality"}}},
	{name: "health check outside isolation", path: "/grpc.health.v1.Health/Check", host: "rogue.example",
		want: seen{Level: criticality.Critical}},
	{name: "not a health check: another method of its service", trusted: true, path: "/grpc.health.v1.Health/Other",
		header: [][2]string{{"triage-criticality", "SHEDDABLE"}}, want: seen{Outcome: outcome.TaskOverloaded}},
}

// manyKeys is n distinct triage keys.
func manyKeys(n int) [][2]string {
	out := make([][2]string, n)
	for i := range out {
		out[i] = [2]string{fmt.Sprintf("triage-k%d", i), "CRITICAL_PLUS"}
	}
	return out
}

// recorder is the handler side: what the last request saw.
type recorder struct {
	mu   sync.Mutex
	last seen
}

func (r *recorder) record(ctx context.Context, keys []string) {
	s := seen{
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

func (r *recorder) take() seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.last
	r.last = seen{}
	return s
}

func TestConformanceGRPCAndHTTP(t *testing.T) {
	grpcCall := conformanceGRPC(t)
	httpCall := conformanceHTTP(t)
	for _, row := range conformanceRows {
		t.Run(row.name, func(t *testing.T) {
			g, h := grpcCall(t, row), httpCall(t, row)
			t.Logf("gRPC: %v | HTTP: %v", g, h)
			if g.String() != row.want.String() {
				t.Errorf("gRPC: %v\n want %v", g, row.want)
			}
			if h.String() != row.want.String() {
				t.Errorf("HTTP: %v\n want %v", h, row.want)
			}
		})
	}
}

func conformanceGRPC(t *testing.T) func(*testing.T, conformanceRow) seen {
	pol, cl, iso, e, m, ctl := conformancePolicy(t)
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(pol), intake.WithClassifier(cl),
		intake.WithIsolation(iso), intake.WithQuota(e, m), intake.WithAdmission(ctl)),
		triagegrpc.WithGroup(func(_ context.Context, md metadata.MD) string {
			if v := md.Get("x-plan"); len(v) == 1 {
				return v[0]
			}
			return ""
		}))
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	gs := grpc.NewServer(append(srv.ServerOptions(), grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		var in emptypb.Empty
		if err := ss.RecvMsg(&in); err != nil {
			return err
		}
		md, _ := metadata.FromIncomingContext(ss.Context())
		var keys []string
		for k := range md {
			keys = append(keys, k)
		}
		rec.record(ss.Context(), keys)
		return ss.SendMsg(&emptypb.Empty{})
	}))...)
	lis, err := net.Listen("tcp", trustedIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conns := map[string]*grpc.ClientConn{}
	conn := func(trusted bool, host string) *grpc.ClientConn {
		src := untrustedIP
		if trusted {
			src = trustedIP
		}
		key := src + "|" + host
		if cc := conns[key]; cc != nil {
			return cc
		}
		var opts []grpc.DialOption
		if host != "" {
			opts = append(opts, grpc.WithAuthority(host))
		}
		cc := dialFrom(t, src, lis.Addr().String(), opts...)
		conns[key] = cc
		return cc
	}
	return func(t *testing.T, row conformanceRow) seen {
		md := metadata.MD{}
		for _, kv := range row.header {
			k := strings.ToLower(kv[0]) // gRPC metadata keys are lower case
			md[k] = append(md[k], kv[1])
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ctx = metadata.NewOutgoingContext(ctx, md)
		err := conn(row.trusted, row.host).Invoke(ctx, row.path, &emptypb.Empty{}, &emptypb.Empty{}, grpc.WaitForReady(true))
		if err != nil {
			oe, ok := triagegrpc.FromStatus(status.Convert(err))
			if !ok {
				t.Fatalf("gRPC %s: %v", row.path, err)
			}
			return seen{Outcome: oe.Kind}
		}
		s := rec.take()
		s.Deadline = withoutCallDeadline(s.Deadline)
		return s
	}
}

// withoutCallDeadline drops the gRPC client's own 10 s call deadline,
// which the HTTP client does not send: a shorter one (a rule's cancel)
// is kept.
func withoutCallDeadline(d time.Duration) time.Duration {
	if d > 9*time.Second {
		return 0
	}
	return d
}

func conformanceHTTP(t *testing.T) func(*testing.T, conformanceRow) seen {
	pol, cl, iso, e, m, ctl := conformancePolicy(t)
	mw, err := triagehttp.Middleware(triagehttp.WithIntake(intake.WithTrust(pol), intake.WithClassifier(cl),
		intake.WithIsolation(iso), intake.WithQuota(e, m)), triagehttp.WithAdmission(ctl),
		triagehttp.WithHealthCheck("/grpc.health.v1.Health/Check"),
		triagehttp.WithGroup(func(r *http.Request) string { return r.Header.Get("X-Plan") }))
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	hs := &http.Server{Handler: mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var keys []string
		for k := range r.Header {
			keys = append(keys, k)
		}
		rec.record(r.Context(), keys)
	}))}
	lis, err := net.Listen("tcp", trustedIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(lis)
	t.Cleanup(func() { hs.Close() })
	clients := map[bool]*http.Client{true: loopback.HTTPClient(trustedIP, 10*time.Second), false: loopback.HTTPClient(untrustedIP, 10*time.Second)}
	return func(t *testing.T, row conformanceRow) seen {
		req, err := http.NewRequest("POST", "http://"+lis.Addr().String()+row.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if row.host != "" {
			req.Host = row.host
		}
		for _, kv := range row.header {
			req.Header[kv[0]] = append(req.Header[kv[0]], kv[1]) // as spelled: the server canonicalizes
		}
		resp, err := clients[row.trusted].Do(req)
		if err != nil {
			t.Fatalf("HTTP %s: %v", row.path, err)
		}
		resp.Body.Close()
		if oe, ok := triagehttp.FromResponse(resp); ok {
			return seen{Outcome: oe.Kind}
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("HTTP %s: %s", row.path, resp.Status)
		}
		return rec.take()
	}
}
