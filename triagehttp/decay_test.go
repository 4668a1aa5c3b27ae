package triagehttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
)

// Over loopback: the edge starts a route's decay at the request's arrival;
// the Transport sends the time left to the next hop, which believes it from
// a trusted peer only and sees the current criticality; a request past its
// decay is sent at the level it fell to; a cancel decay is a deadline.
func TestDecayStartsAtTheEdgeAndTravels(t *testing.T) {
	f := clock.NewFake(time.Unix(1e9, 0))
	// The next hop reports what it sees: level, and the time left to the decay.
	report := func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		left := "none"
		if d, ok := criticality.DecayOf(ctx); ok {
			left = fmt.Sprintf("%v->%v", d.At.Sub(f.Now()), d.To)
		}
		if dl, ok := ctx.Deadline(); ok {
			left += fmt.Sprintf(" deadline %v", dl.Sub(f.Now()))
		}
		fmt.Fprintf(w, "%v %s", criticality.Of(ctx), left)
	}
	next := func(trusted bool) *httptest.Server {
		opts := []triagehttp.Option{triagehttp.WithIntake(intake.WithClock(f))}
		if trusted {
			opts = append(opts, triagehttp.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}}))))
		}
		mw, err := triagehttp.Middleware(opts...)
		if err != nil {
			t.Fatal(err)
		}
		s := httptest.NewServer(mw(http.HandlerFunc(report)))
		t.Cleanup(s.Close)
		return s
	}
	trustedHop, untrustedHop := next(true), next(false)

	cl := edge.MustNew(edge.Config{Rules: []edge.RuleConfig{
		{PathPrefix: "/home", Criticality: "CRITICAL_PLUS", Decay: &edge.DecayConfig{After: "2s", To: "SHEDDABLE"}},
		{PathPrefix: "/cart", Criticality: "CRITICAL", Decay: &edge.DecayConfig{After: "1500ms", To: "cancel"}},
	}})
	mw, err := triagehttp.Middleware(triagehttp.WithIntake(intake.WithClassifier(cl), intake.WithClock(f)))
	if err != nil {
		t.Fatal(err)
	}
	tr := &triagehttp.Transport{Caller: loopback.Caller(t, egress.WithoutPolicy(), egress.WithClock(f))}
	var hop string
	var wait time.Duration
	edgeSrv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/cart" {
			report(w, r)
			return
		}
		f.Advance(wait) // the request waits at the edge
		req, _ := http.NewRequestWithContext(r.Context(), "GET", hop, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Error(err)
			return
		}
		defer resp.Body.Close()
		io.Copy(w, resp.Body)
	})))
	defer edgeSrv.Close()
	get := func(path string) string {
		resp, err := http.Get(edgeSrv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	for _, tc := range []struct {
		hop  *httptest.Server
		wait time.Duration
		want string
	}{
		{trustedHop, 500 * time.Millisecond, "CRITICAL_PLUS 1.5s->SHEDDABLE"},
		{trustedHop, 2 * time.Second, "SHEDDABLE none"},
		{untrustedHop, 500 * time.Millisecond, "CRITICAL none"},
	} {
		hop, wait = tc.hop.URL, tc.wait
		if got := get("/home"); got != tc.want {
			t.Errorf("after %v at the edge, the next hop saw %q, want %q", tc.wait, got, tc.want)
		}
	}
	if got := get("/cart"); got != "CRITICAL none deadline 1.5s" {
		t.Errorf("a cancel decay: the handler saw %q, want a 1.5s deadline", got)
	}
}
