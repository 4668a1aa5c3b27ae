package triageyaml_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/triageyaml"
)

const goodEdge = `trust:
  networks: ["10.0.0.0/8"]
criticality:
  default: CRITICAL
  rules:
    - path_prefix: /checkout
      criticality: CRITICAL_PLUS
    - path_prefix: /prefetch
      criticality: SHEDDABLE
`

// The operator edits the edge file: the next request through a real
// server is classified by the new rules and trusted by the new networks,
// without a restart; a bad edit is refused with its line and column, and
// the rules in force stay.
func TestWatchEdge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(path, []byte(goodEdge), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := triageyaml.LoadEdge(path)
	if err != nil {
		t.Fatal(err)
	}
	pol, rules, err := cfg.Build()
	if err != nil {
		t.Fatal(err)
	}
	w, err := triageyaml.WatchEdge(path, pol, rules, triageyaml.WithWatchClock(clock.NewFake(time.Unix(0, 0))))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithIntake(intake.WithTrust(pol), intake.WithClassifier(rules)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, criticality.Of(r.Context()).String())
	})))
	defer srv.Close()
	get := func(path string, header string) string {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		if header != "" {
			req.Header.Set("Triage-Criticality", header)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got := get("/prefetch", ""); got != "SHEDDABLE" {
		t.Fatalf("initial rules: /prefetch is %s", got)
	}
	edit := strings.Replace(goodEdge, "criticality: SHEDDABLE", "criticality: SHEDDABLE_PLUS", 1)
	edit = strings.Replace(edit, "10.0.0.0/8", "127.0.0.1/32", 1)
	edit = strings.Replace(edit, "  rules:\n", "  rules:\n    - header: true\n", 1)
	os.WriteFile(path, []byte(edit), 0o600)
	if ok, err := w.Check(); !ok || err != nil {
		t.Fatalf("reload: %v, %v", ok, err)
	}
	if got := get("/prefetch", ""); got != "SHEDDABLE_PLUS" {
		t.Fatalf("after the edit, /prefetch is %s, want SHEDDABLE_PLUS", got)
	}
	if got := get("/x", "SHEDDABLE"); got != "SHEDDABLE" {
		t.Fatalf("after the edit, loopback's header is not believed: %s", got)
	}
	bad := strings.Replace(edit, "criticality: CRITICAL_PLUS", "criticality: CRITICAL_PLUSS", 1)
	os.WriteFile(path, []byte(bad), 0o600)
	ok, err := w.Check()
	if ok || err == nil || !strings.Contains(err.Error(), "line 7, column 7") {
		t.Fatalf("a misspelt criticality: %v, %v; want refused at line 7, column 7", ok, err)
	}
	if got := get("/checkout", ""); got != "CRITICAL_PLUS" {
		t.Fatalf("a refused file changed the rules: /checkout is %s", got)
	}
	badNet := strings.Replace(edit, "127.0.0.1/32", "127.0.0.300/32", 1)
	os.WriteFile(path, []byte(badNet), 0o600)
	if _, err := w.Check(); err == nil || !strings.Contains(err.Error(), "line 2, column 14") {
		t.Fatalf("a bad network: %v; want refused at line 2, column 14", err)
	}
	if got := get("/x", "SHEDDABLE"); got != "SHEDDABLE" {
		t.Fatalf("a refused file changed the trusted networks: %s", got)
	}
	if _, err := triageyaml.WatchEdge(path, nil, rules); err == nil {
		t.Fatal("WatchEdge without a policy")
	}
}
