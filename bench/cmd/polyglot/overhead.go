package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/triagehq/triage/internal/measure"
	"github.com/triagehq/triage/loadtest"
)

// overhead measures what the sidecar adds to a request's latency at
// 0.5x the upstream's capacity: one open-loop Poisson stream at half of C,
// sent in alternate 3 s windows straight to the upstream and through the
// sidecar, so that the machine's drifts fall on both paths alike and each
// window's requests meet only each other at the upstream. It returns the p50 and p99
// of each path, in milliseconds.
func (c config) overhead(up, cpu string, d time.Duration) (direct, sidecar [2]float64, n [2]int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	out := filepath.Join(c.out, up+"-overhead")
	stopUp, err := c.start(ctx, out, "upstream", upstreamPort, c.upstreamArgv(up)...)
	if err != nil {
		return direct, sidecar, n, err
	}
	defer stopUp()
	upURL := fmt.Sprintf("http://127.0.0.1:%d/", upstreamPort)
	capacity, err := c.probe(ctx, filepath.Join(out, "probe"), upURL)
	if err != nil {
		return direct, sidecar, n, err
	}
	argv, _ := c.proxyArgv(up, "sidecar", out, capacity)
	stopPx, err := c.startOn(ctx, cpu, out, "sidecar", proxyPort, argv...)
	if err != nil {
		return direct, sidecar, n, err
	}
	defer stopPx()
	urls := [2]string{upURL, fmt.Sprintf("http://127.0.0.1:%d/", proxyPort)}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1000}, Timeout: 5 * time.Second}
	var mu sync.Mutex
	var lat [2][]float64
	rate := capacity / 2
	var cur, next time.Duration // one Poisson stream at rate; cur is the send's time
	poisson := func(int) (time.Duration, bool) {
		cur = next
		next += time.Duration(rand.ExpFloat64() / rate * float64(time.Second))
		return cur, cur < d
	}
	loadtest.OpenLoop{}.Run(ctx, poisson, func(_ int, lag time.Duration) func() {
		sent := time.Now().Add(-lag)
		path := int(cur/(3*time.Second)) % 2 // the paths alternate every 3 s
		return func() {
			resp, err := client.Get(urls[path])
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return
			}
			mu.Lock()
			lat[path] = append(lat[path], float64(time.Since(sent).Microseconds())/1000)
			mu.Unlock()
		}
	})
	pct := func(v []float64, q float64) float64 {
		slices.Sort(v)
		if len(v) == 0 {
			return 0
		}
		return measure.Quantile(v, q)
	}
	for i, v := range lat {
		n[i] = len(v)
	}
	direct = [2]float64{pct(lat[0], 0.5), pct(lat[0], 0.99)}
	sidecar = [2]float64{pct(lat[1], 0.5), pct(lat[1], 0.99)}
	return direct, sidecar, n, nil
}

// runOverhead prints the overhead measurement for each upstream, with
// the sidecar on the upstream's CPU and on the load's (idle at 0.5x: the
// sidecar's own cost without waiting for the upstream's CPU), -repeats
// times.
func (c config) runOverhead(d time.Duration) error {
	for _, up := range c.upstreams {
		for rep := 1; rep <= c.repeats; rep++ {
			for _, cpu := range []string{c.serverCPU, c.loadCPU} {
				dir, sc, n, err := c.overhead(up, cpu, d)
				if err != nil {
					return err
				}
				fmt.Printf("%s overhead run %d, sidecar on CPU %s: direct p50 %.2f p99 %.2f ms (%d), sidecar p50 %.2f p99 %.2f ms (%d): +%.0f µs p50, +%.2f ms p99\n",
					up, rep, cpu, dir[0], dir[1], n[0], sc[0], sc[1], n[1], 1000*(sc[0]-dir[0]), sc[1]-dir[1])
			}
		}
	}
	return nil
}
