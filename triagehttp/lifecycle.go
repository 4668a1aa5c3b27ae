package triagehttp

import (
	"context"
	"errors"
	"net/http"

	"github.com/triagehq/triage/lifecycle"
)

// ReadyPath and LivePath are where triage's commands answer an
// orchestrator's probes (HealthHandler and LivenessHandler): on their
// metrics listener, and the sidecar on its serving address too.
const (
	ReadyPath = "/triage/ready"
	LivePath  = "/triage/live"
)

// HealthHandler answers a health check from l's state: 200 "serving", or
// 503 "lame duck" with Triage-Lame-Duck: 1 while the task is in lame duck,
// so that load balancers and probes send new requests elsewhere. Mount it
// at the path given to WithHealthCheck so that admission never refuses it.
func HealthHandler(l *lifecycle.Lifecycle) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if l.InLameDuck() {
			w.Header()[lameDuckHeader] = lameDuckValue
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("lame duck\n"))
			return
		}
		_, _ = w.Write([]byte("serving\n"))
	})
}

// LivenessHandler answers a liveness probe: 200 "alive" whenever the
// server answers at all, in warm-up and lame duck too, so that the probe
// restarts a task that is stuck and never one that is warming up or
// draining. Mount it at a path given to WithHealthCheck, beside
// HealthHandler's, which answers the readiness probe.
func LivenessHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte("alive\n"))
	})
}

// Announce ties srv to l: while l is in lame duck, srv closes its idle
// keep-alive connections and closes each connection after its current
// response, so that clients reconnect, through their load balancer, to
// another task; when l is Ready again, keep-alives resume. Call the
// returned func to stop.
func Announce(l *lifecycle.Lifecycle, srv *http.Server) (stop func()) {
	return l.Subscribe(func(lame bool) { srv.SetKeepAlivesEnabled(!lame) })
}

// Shutdown returns the stop function of lifecycle.Lifecycle.Shutdown for
// srv: srv.Shutdown, which closes the listeners and waits for requests in
// flight, cut short by srv.Close when the context ends first.
func Shutdown(srv *http.Server) func(context.Context) error {
	return func(ctx context.Context) error {
		err := srv.Shutdown(ctx)
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			_ = srv.Close()
		}
		return err
	}
}
