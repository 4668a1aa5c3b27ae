package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/triagehq/triage/bench/internal/triagebin"
)

// The egress rows: `triage sidecar` with two -egress routes, A to a
// hostile upstream and B to a sound one. The local service (this
// program) calls through A, 200 calls a second with 1 s deadlines, while
// the upstream behind A misbehaves; the CRITICAL caller calls through B,
// one call every 10 ms. A hostile upstream must cost the service's
// calls to another no more than it costs its own.

// egressAttack is one egress row: how the upstream behind route A
// answers.
type egressAttack struct {
	name    string
	handler http.HandlerFunc
}

var egressAttacks = []egressAttack{
	{"upstream never answers", func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}},
	{"upstream answers a byte every 100 ms", func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		for i := 0; i < 100 && r.Context().Err() == nil; i++ {
			w.Write([]byte("x"))
			rc.Flush()
			time.Sleep(100 * time.Millisecond)
		}
	}},
	{"upstream answers 503 with Retry-After: 0 at once", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
	}},
	{"upstream answers with 60 KiB of headers", func(w http.ResponseWriter, r *http.Request) {
		for i := range 1000 {
			w.Header().Set(fmt.Sprintf("X-Flood-%d", i), strings.Repeat("a", 48))
		}
		io.WriteString(w, "ok")
	}},
}

// egressRows runs the egress rows.
func egressRows(bin string, dur time.Duration, only string) error {
	fmt.Printf("\n| the upstream behind egress route A (%v; the service calls it 200/s) | CRITICAL calls through route B served during | recovery after | the sidecar at the attack's end |\n|---|---|---|---|\n", dur)
	good, stopGood, err := serveHTTP(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	if err != nil {
		return err
	}
	defer stopGood()
	return printRows(egressAttacks, only, func(a egressAttack) (string, error) { return egressRow(bin, good, a, dur) })
}

func egressRow(bin, good string, a egressAttack, dur time.Duration) (string, error) {
	bad, stopBad, err := serveHTTP(a.handler)
	if err != nil {
		return "", err
	}
	defer stopBad()
	routeA, err := freeAddr()
	if err != nil {
		return "", err
	}
	routeB, err := freeAddr()
	if err != nil {
		return "", err
	}
	metrics, err := freeAddr()
	if err != nil {
		return "", err
	}
	sc, err := triagebin.Start(bin, "sidecar", "-upstream", "http://"+good, "-listen", "127.0.0.1:0", "-drain", "0s", "-metrics", metrics,
		"-egress", routeA+"=http://"+bad, "-egress", routeB+"=http://"+good)
	if err != nil {
		return "", err
	}
	defer sc.Stop()
	hc := &http.Client{Timeout: time.Second}
	attack := func(ctx context.Context) {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		var wg sync.WaitGroup
		defer wg.Wait()
		for ctx.Err() == nil {
			wg.Go(func() { get(hc, routeA) })
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}
	served, err := measure(func() error { return get(hc, routeB) }, dur, attack, func() string { return state(metrics, sc.Pid(), true) })
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("| %s | %s |", a.name, served), nil
}

// serveHTTP serves h on a loopback port.
func serveHTTP(h http.HandlerFunc) (addr string, stop func(), err error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "upstream:", err)
		}
	}()
	return lis.Addr().String(), func() { srv.Close() }, nil
}
