package triagesidecar

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/triagehttp"
)

// UpstreamProbe says whether the upstream is ready: it asks the upstream's
// own readiness path, so that the sidecar's readiness follows the service
// behind it and an orchestrator stops sending to a pod whose service has
// stopped answering (or answers its probe 5xx). Build one with
// NewUpstreamProbe.
//
// Ready asks at most once per interval; the probes in between get the last
// answer. It is safe for concurrent use, and holds one answer: an asking
// probe waits for the one request in flight.
type UpstreamProbe struct {
	url      string
	rt       http.RoundTripper
	interval time.Duration
	timeout  time.Duration
	clock    clock.Clock

	mu      sync.Mutex
	checked time.Time
	err     error
}

// NewUpstreamProbe returns a probe of path on upstream (a path starting
// with "/"), asked through rt (nil: http.DefaultTransport) at most once a
// second, each ask bounded by timeout (0: 1 s). An answer 2xx or 3xx is
// ready; anything else, or no answer, is not.
func NewUpstreamProbe(upstream *url.URL, path string, rt http.RoundTripper, timeout time.Duration, clk clock.Clock) (*UpstreamProbe, error) {
	if upstream == nil || len(path) == 0 || path[0] != '/' {
		return nil, fmt.Errorf("triagesidecar: the upstream's readiness path %q must start with /", path)
	}
	u := *upstream
	if u.Scheme == "h2c" {
		u.Scheme = "http"
	}
	ref, err := url.Parse(path)
	if err != nil {
		return nil, fmt.Errorf("triagesidecar: the upstream's readiness path %q: %w", path, err)
	}
	if rt == nil {
		rt = http.DefaultTransport
	}
	if timeout <= 0 {
		timeout = time.Second
	}
	return &UpstreamProbe{url: u.ResolveReference(ref).String(), rt: rt, interval: time.Second, timeout: timeout, clock: clock.OrReal(clk)}, nil
}

// Ready returns nil if the upstream answered its readiness path 2xx or 3xx
// when last asked, asking again if that was an interval ago.
func (p *UpstreamProbe) Ready(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	if !p.checked.IsZero() && now.Sub(p.checked) < p.interval {
		return p.err
	}
	p.err = p.ask(ctx)
	p.checked = now
	return p.err
}

func (p *UpstreamProbe) ask(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return err
	}
	resp, err := p.rt.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("upstream not ready: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("upstream not ready: %s answered %d", p.url, resp.StatusCode)
	}
	return nil
}

// ReadyHandler answers the sidecar's readiness probe: 503 while the
// upstream is not ready (p nil: never), else triagehttp.HealthHandler's
// answer (503 in lame duck, 200 serving).
func ReadyHandler(lc *lifecycle.Lifecycle, p *UpstreamProbe) http.Handler {
	health := triagehttp.HealthHandler(lc)
	if p == nil {
		return health
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := p.Ready(r.Context()); err != nil {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, err.Error()+"\n")
			return
		}
		health.ServeHTTP(w, r)
	})
}
