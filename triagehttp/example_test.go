package triagehttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagehttp"
)

// An HTTP frontend sets criticality by host and path; a spoofed header from
// an untrusted client is ignored; suggestions are shed when busy.
func ExampleMiddleware() {
	rules, _ := edge.New(edge.Config{
		Default: "CRITICAL",
		Rules: []edge.RuleConfig{
			{Header: true}, // believed only from trusted peers: none here
			{Host: "batch.example.com", Criticality: "SHEDDABLE"},
			{PathPrefix: "/suggest", Criticality: "SHEDDABLE_PLUS"},
		},
	})
	mw, _ := triagehttp.Middleware(triagehttp.WithIntake(intake.WithClassifier(rules)))
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/suggest/busy" {
			triagehttp.WriteError(w, outcome.New(outcome.TaskOverloaded, "busy"))
			return
		}
		fmt.Fprint(w, criticality.Of(r.Context()))
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	get := func(host, path, spoof string) {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Host = host
		if spoof != "" {
			req.Header.Set("Triage-Criticality", spoof)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, resp.Header.Get("Triage-Outcome"), string(body))
	}
	get("www.example.com", "/", "")
	get("batch.example.com", "/", "CRITICAL_PLUS")
	get("www.example.com", "/suggest", "")
	get("www.example.com", "/suggest/busy", "")
	// Output:
	// 200  CRITICAL
	// 200  SHEDDABLE
	// 200  SHEDDABLE_PLUS
	// 503 task-overloaded triage: task overloaded (busy)
}
