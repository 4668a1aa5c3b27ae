package triagehttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"

	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
)

// Header spellings a downstream may fold (issue 21, item 8): CGI and
// WSGI-style environments and some proxies read Triage_Criticality as
// triage-criticality, so the edge drops every triage key spelled with an
// underscore, whatever the peer (as Envoy's headers_with_underscores_action
// does): an untrusted caller's never reaches the handler, and a trusted
// one's is not triage's spelling either. Over loopback.
func TestUnderscoreSpellingsNeverReachTheHandler(t *testing.T) {
	for _, trusted := range []bool{false, true} {
		var opts []triagehttp.Option
		if trusted {
			opts = append(opts, triagehttp.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}}))))
		}
		mw, err := triagehttp.Middleware(opts...)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var names []string
			for k := range r.Header {
				if strings.HasPrefix(strings.ToLower(strings.ReplaceAll(k, "_", "-")), "triage-") {
					names = append(names, k)
				}
			}
			sort.Strings(names)
			io.WriteString(w, strings.Join(names, ","))
		})))
		req, _ := http.NewRequest("GET", srv.URL, nil)
		for _, k := range []string{"Triage_Criticality", "TRIAGE_CUSTOMER", "triage_attempt", "Triage_Anything"} {
			req.Header[k] = []string{"CRITICAL_PLUS"}
		}
		req.Header.Set("X-Other_Header", "kept")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if len(got) != 0 {
			t.Errorf("trusted %v: the handler saw %s", trusted, got)
		}
	}
}
