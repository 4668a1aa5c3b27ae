package triagesidecar_test

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/triagesidecar"
	"github.com/triagehq/triage/trust"
)

// A service in another language (here a stand-in) behind the sidecar:
// callers on loopback are trusted, admission runs in latency mode, and
// the service receives the criticality the caller sent.
func ExampleIngress() {
	service := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "served at", r.Header.Get("Triage-Criticality"))
	}))
	defer service.Close()
	upstream, err := url.Parse(service.URL)
	if err != nil {
		log.Fatal(err)
	}
	ctl, err := admission.New(admission.WithTolerance(1.2), admission.WithLimits(2, 4, admission.DefaultMaxLimit))
	if err != nil {
		log.Fatal(err)
	}
	pol := trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})
	in, err := triagesidecar.Ingress(upstream, triagesidecar.WithMiddleware(triagehttp.WithIntake(intake.WithTrust(pol)), triagehttp.WithAdmission(ctl)))
	if err != nil {
		log.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: in, ConnContext: triagehttp.ConnContext}
	go srv.Serve(lis)
	defer srv.Close()

	req, _ := http.NewRequest("GET", "http://"+lis.Addr().String()+"/search", nil)
	req.Header.Set("Triage-Criticality", "SHEDDABLE_PLUS")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Print(resp.Status, " ", string(body))
	// Output: 200 OK served at SHEDDABLE_PLUS
}
