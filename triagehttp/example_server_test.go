package triagehttp_test

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
)

// A net/http server protected by admission control, with readiness and
// liveness probes that admission never refuses: when the task is full it
// answers SHEDDABLE work 503 with Triage-Outcome: task-overloaded and
// Retry-After before it lets more critical work wait.
func Example_server() {
	ctl, err := admission.New() // no limit to tune: it finds the task's own
	if err != nil {
		log.Fatal(err)
	}
	lc, err := lifecycle.New()
	if err != nil {
		log.Fatal(err)
	}
	pol := trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl), triagehttp.WithIntake(intake.WithTrust(pol)),
		triagehttp.WithLifecycle(lc), triagehttp.WithHealthCheck("/readyz", "/livez"))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/readyz", triagehttp.HealthHandler(lc))
	mux.Handle("/livez", triagehttp.LivenessHandler())
	mux.HandleFunc("/search", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "results at", criticality.Of(r.Context()))
	})
	srv := &http.Server{Handler: mw(mux), ConnContext: triagehttp.ConnContext}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Close()

	req, _ := http.NewRequest("GET", "http://"+lis.Addr().String()+"/search", nil)
	req.Header.Set("Triage-Criticality", "SHEDDABLE_PLUS") // believed: loopback is trusted
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Print(resp.Status, " ", string(body))
	// Output: 200 OK results at SHEDDABLE_PLUS
}
