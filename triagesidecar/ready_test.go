package triagesidecar_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/triagesidecar"
)

// The sidecar's readiness follows the upstream's own: 503 while the
// upstream answers its readiness path 5xx or not at all, asked at most
// once a second (on the fake clock), and the lifecycle's answer otherwise.
func TestReadinessFollowsTheUpstream(t *testing.T) {
	var status atomic.Int32
	status.Store(http.StatusOK)
	var asked atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			t.Errorf("the probe asked %s", r.URL.Path)
		}
		asked.Add(1)
		w.WriteHeader(int(status.Load()))
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	clk := clock.NewFake(time.Unix(0, 0))
	probe, err := triagesidecar.NewUpstreamProbe(u, "/healthz", nil, time.Second, clk)
	if err != nil {
		t.Fatal(err)
	}
	lc, err := lifecycle.New()
	if err != nil {
		t.Fatal(err)
	}
	lc.Ready()
	h := triagesidecar.ReadyHandler(lc, probe)
	get := func() int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/triage/ready", nil))
		return rec.Code
	}
	if got := get(); got != 200 {
		t.Fatalf("upstream ready: %d, want 200", got)
	}
	status.Store(http.StatusInternalServerError)
	if got := get(); got != 200 || asked.Load() != 1 {
		t.Fatalf("within the interval: %d after %d asks, want the last answer (200) and no new ask", got, asked.Load())
	}
	clk.Advance(time.Second)
	if got := get(); got != 503 {
		t.Errorf("upstream answering its probe 500: %d, want 503", got)
	}
	status.Store(http.StatusOK)
	clk.Advance(time.Second)
	if got := get(); got != 200 {
		t.Errorf("upstream ready again: %d, want 200", got)
	}
	up.Close()
	clk.Advance(time.Second)
	if got := get(); got != 503 {
		t.Errorf("upstream gone: %d, want 503", got)
	}
	if _, err := triagesidecar.NewUpstreamProbe(u, "healthz", nil, 0, nil); err == nil {
		t.Error("a path without a leading / was accepted")
	}
}
