package triagehttp_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/triagehttp"
)

// Triage's keys travel in headers only: a request's trailers that name
// one are removed before the handler (or a proxy behind it) sees them,
// whoever sent them (issue 55: the sidecar forwarded them upstream).
func TestTriageTrailersAreRemoved(t *testing.T) {
	for _, ctlOn := range []bool{false, true} {
		var opts []triagehttp.Option
		if ctlOn {
			ctl, err := admission.New()
			if err != nil {
				t.Fatal(err)
			}
			opts = append(opts, triagehttp.WithAdmission(ctl))
		}
		mw, err := triagehttp.Middleware(opts...)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan http.Header, 1)
		srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			got <- r.Trailer.Clone()
		})))
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"+
			"5\r\nhello\r\n0\r\nX-Sum: 1\r\nTriage-Criticality: CRITICAL_PLUS\r\nTriage-Customer: someone-else\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		c.Close()
		srv.Close()
		tr := <-got
		t.Logf("admission %v: trailers %v", ctlOn, tr)
		for k := range tr {
			if strings.HasPrefix(strings.ToLower(k), "triage-") {
				t.Errorf("admission %v: the handler saw trailer %s: %v", ctlOn, k, tr)
			}
		}
		if tr.Get("X-Sum") != "1" {
			t.Errorf("admission %v: other trailers must pass: %v", ctlOn, tr)
		}
	}
}
