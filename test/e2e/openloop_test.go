package e2e

import (
	"context"
	"net"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/triagehttp"
)

// shot is one request of an open-loop schedule: what to send, and when
// from the start.
type shot struct {
	key string
	at  time.Duration
}

// schedule is an open-loop load: requests at fixed rates over intervals.
type schedule []shot

// add sends key at rate per second from from to to.
func (s *schedule) add(key string, rate float64, from, to time.Duration) {
	for at := from; at < to; at += time.Duration(float64(time.Second) / rate) {
		*s = append(*s, shot{key, at})
	}
}

// run fires every shot at its time and waits for all of them: fire runs
// on the pacing goroutine, with the time elapsed, and returns the request,
// which runs in a goroutine of its own (their count is bounded by the
// schedule).
func (s schedule) run(fire func(el time.Duration, sh shot) func()) {
	sort.SliceStable(s, func(i, j int) bool { return s[i].at < s[j].at })
	var wg sync.WaitGroup
	start := time.Now()
	for _, sh := range s {
		if d := time.Until(start.Add(sh.at)); d > 0 {
			time.Sleep(d) // pacing an open-loop load generator in real time
		}
		req := fire(time.Since(start), sh)
		wg.Add(1)
		go func() {
			defer wg.Done()
			req()
		}()
	}
	wg.Wait()
}

// relayFrontend serves an HTTP frontend on loopback behind mw: each
// request is relayed over cc with the body body(r), within timeout (0:
// none), and answered 200, or the overload outcome. It returns the base
// URL and a client with room for thousands of connections.
func relayFrontend(t *testing.T, mw func(http.Handler) http.Handler, cc grpc.ClientConnInterface, timeout time.Duration, body func(*http.Request) string) (string, *http.Client) {
	t.Helper()
	front := &http.Server{Handler: mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		if _, err := relay.Invoke(ctx, cc, body(r)); err != nil {
			if !triagehttp.WriteError(w, err) {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			return
		}
		w.WriteHeader(http.StatusOK)
	}))}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go front.Serve(ln)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2000}, Timeout: 30 * time.Second}
	t.Cleanup(func() {
		front.Close()
		hc.CloseIdleConnections()
	})
	return "http://" + ln.Addr().String(), hc
}
