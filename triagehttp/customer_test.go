package triagehttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
)

// Over loopback: the customer a trusted peer names is believed; a
// malformed name, or any name from an untrusted peer, is nobody.
func TestCustomerFromTrustedPeersOnly(t *testing.T) {
	for _, tc := range []struct {
		trusted bool
		header  string
		want    string
	}{
		{true, "gmail", "gmail"},
		{true, "not a name", ""},
		{true, strings.Repeat("a", 65), ""},
		{false, "gmail", ""},
	} {
		var opts []triagehttp.Option
		if tc.trusted {
			opts = append(opts, triagehttp.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}}))))
		}
		mw, err := triagehttp.Middleware(opts...)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, quota.CustomerOf(r.Context()))
		})))
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("Triage-Customer", tc.header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if string(got) != tc.want {
			t.Errorf("trusted %v, header %q: customer %q, want %q", tc.trusted, tc.header, got, tc.want)
		}
	}
}
