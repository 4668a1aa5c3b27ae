package drill

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/connload"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagehttp"
)

// The frontend's criticality rules: by path, as the CRE post suggests.
var frontendRules = edge.Config{Default: "CRITICAL", Rules: []edge.RuleConfig{
	{PathPrefix: "/checkout", Criticality: "CRITICAL_PLUS"},
	{PathPrefix: "/search", Criticality: "CRITICAL"},
	{PathPrefix: "/suggest", Criticality: "SHEDDABLE_PLUS"},
	{PathPrefix: "/prefetch", Criticality: "SHEDDABLE"},
}}

// Customers are identified at the frontend from their API key.
var apiKeys = map[string]string{"key-gmail": "gmail", "key-calendar": "calendar", "key-android": "android", "key-abuser": "abuser"}

// DefaultFrontendConns is the protected frontend's default bound on open
// connections (Task.MaxConns): each costs it a goroutine and buffers, and
// every request it sends costs it CPU to answer, refusals included, so
// that a population of clients past it would take the CPU its backends
// need (bench/cmd/frontendload).
const DefaultFrontendConns = 1000

// MaxFrontendConns bounds Task.MaxConns.
const MaxFrontendConns = 100000

// serveFrontend is the HTTP frontend: criticality by rules, customer by
// API key, one call to A per request.
func (t *task) serveFrontend(ln net.Listener, next *grpc.ClientConn) (func(), error) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer t.hold()()
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if c := apiKeys[r.Header.Get("X-Api-Key")]; c != "" {
			ctx = quota.NewContext(ctx, c)
		}
		l := criticality.Of(ctx)
		t.spent.handled(l)
		began := time.Now()
		out, err := relay.Invoke(ctx, next, "full")
		t.spent.add(l, partDownstream, time.Since(began))
		if err != nil {
			t.reject(reasonOf(err))
			if !triagehttp.WriteError(w, err) {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			return
		}
		t.served.Add(1)
		if out == "partial" {
			t.degraded.Add(1)
			w.Header().Set("X-Degraded", "1")
		}
		w.WriteHeader(http.StatusOK)
	})
	var handler http.Handler = h
	if t.cfg.Protect {
		ctl, err := admission.New(admission.WithObserver(observer{t: t}))
		if err != nil {
			return nil, err
		}
		t.ctl = ctl
		cl, err := edge.New(frontendRules)
		if err != nil {
			return nil, err
		}
		mw, err := triagehttp.Middleware(triagehttp.WithIntake(intake.WithClassifier(cl)), triagehttp.WithAdmission(ctl), triagehttp.WithIntake(intake.WithShadow(t.shadowing()),
			intake.WithTracer(intakeSpent{&t.spent})))
		if err != nil {
			return nil, err
		}
		handler = mw(h)
	} else {
		// Unprotected, criticality still travels (it is how the traffic is
		// labelled), but nothing acts on it.
		cl, _ := edge.New(frontendRules)
		mw, err := triagehttp.Middleware(triagehttp.WithIntake(intake.WithClassifier(cl)))
		if err != nil {
			return nil, err
		}
		handler = mw(h)
	}
	if t.cfg.Protect && t.cfg.MaxConns > 0 {
		cl, err := connload.NewListener(ln, connload.WithMaxOpen(t.cfg.MaxConns))
		if err != nil {
			return nil, err
		}
		ln = cl
	}
	s := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second, ConnContext: triagehttp.ConnContext}
	lc, err := lifecycle.New(lifecycle.WithDrain(time.Second))
	if err != nil {
		return nil, err
	}
	unsubscribe := triagehttp.Announce(lc, s)
	go func() {
		connectNext(next) // connections wait in the listen queue meanwhile
		s.Serve(ln)
	}()
	return func() {
		defer unsubscribe()
		sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		lc.Shutdown(sctx, triagehttp.Shutdown(s))
	}, nil
}

// reasonOf names an error for the rejection counts.
func reasonOf(err error) string {
	if oe, ok := outcome.As(err); ok {
		return oe.Kind.Token()
	}
	if errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "DeadlineExceeded") {
		return "deadline"
	}
	return "error"
}
