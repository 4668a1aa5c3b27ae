package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	measuring "github.com/triagehq/triage/internal/measure"
)

// soakSample is one reading of the sidecar's own metrics.
type soakSample struct {
	at              time.Duration
	goroutines, rss float64
}

// runSoak runs the sidecar in front of up at 10x its probed capacity for
// d (issue 56), as load steps of a minute back to back: the sidecar's
// goroutines and resident memory read from its metrics every 10 s, each
// minute's goodput and callers' p99. It prints each minute and how far
// the goroutines and memory strayed, after the first minute, from the
// second minute's (medians of the minute's readings), and the idle
// goroutine count before the load against the count once the load is gone
// (settle): a leak keeps the second above the first.
func (c config) runSoak(up string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d+8*time.Minute)
	defer cancel()
	out := filepath.Join(c.out, up+"-soak")
	stopUp, err := c.start(ctx, out, "upstream", upstreamPort, c.upstreamArgv(up)...)
	if err != nil {
		return err
	}
	defer stopUp()
	upURL := fmt.Sprintf("http://127.0.0.1:%d/", upstreamPort)
	capacity, err := c.probe(ctx, filepath.Join(out, "probe"), upURL)
	if err != nil {
		return err
	}
	argv, err := c.proxyArgv(up, "sidecar", out, capacity)
	if err != nil {
		return err
	}
	stopPx, err := c.start(ctx, out, "sidecar", proxyPort, argv...)
	if err != nil {
		return err
	}
	defer stopPx()
	idleBefore, _, err := sidecarRuntime()
	if err != nil {
		return err
	}
	var (
		mu      sync.Mutex
		samples []soakSample
	)
	start := time.Now()
	sctx, stopSampling := context.WithCancel(ctx)
	go func() {
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
			if g, rss, err := sidecarRuntime(); err == nil {
				mu.Lock()
				samples = append(samples, soakSample{time.Since(start), g, rss})
				mu.Unlock()
			}
		}
	}()
	minutes := max(int(d/time.Minute), 1)
	r, err := c.loadtest(ctx, filepath.Join(out, "load"), "-url", fmt.Sprintf("http://127.0.0.1:%d/", proxyPort),
		"-capacity", strconv.FormatFloat(capacity, 'f', 1, 64), "-loads", strings.Repeat("10,", minutes-1)+"10", "-step", "1m",
		"-max-duration", (d + 2*time.Minute).String())
	stopSampling()
	if err != nil {
		return err
	}
	idleAfter, settled := settle(ctx, idleBefore)
	mu.Lock()
	defer mu.Unlock()
	fmt.Printf("%s behind the sidecar at 10x C (C = %.0f req/s), %d steps of a minute back to back\n\n", up, capacity, minutes)
	fmt.Println("| minute | goodput (of C) | callers' p99 (ms) | sidecar goroutines | sidecar RSS (MiB) |\n|---|---|---|---|---|")
	var base soakSample
	worstG, worstR := 0.0, 0.0
	for m, st := range r.Steps {
		var gs, rs []float64
		for _, s := range samples {
			if int(s.at/time.Minute) == m {
				gs, rs = append(gs, s.goroutines), append(rs, s.rss/(1<<20))
			}
		}
		g, rss := measuring.Median(gs), measuring.Median(rs)
		if m == 1 {
			base = soakSample{goroutines: g, rss: rss}
		}
		if m >= 1 && base.goroutines > 0 {
			worstG = max(worstG, abs(g/base.goroutines-1))
			worstR = max(worstR, abs(rss/base.rss-1))
		}
		fmt.Printf("| %d | %.2f | %.0f | %.0f | %.1f |\n", m+1, st.Goodput, st.Latency.P99, g, rss)
	}
	fmt.Printf("\nafter the first minute, against the second: goroutines within %.0f%%, RSS within %.0f%%\n", 100*worstG, 100*worstR)
	fmt.Printf("idle goroutines: %.0f before the load, %.0f %s after it\n", idleBefore, idleAfter, settled)
	return nil
}

// settle waits, after the load, until the sidecar holds no more
// goroutines than it did idle before it (want): its callers' connections
// close when the load generator exits, its idle connections to the
// upstream after the transport's idle timeout (90 s). It returns the last
// reading and when it was taken; a count that stays above want for three
// minutes is what a leak looks like.
func settle(ctx context.Context, want float64) (float64, string) {
	start := time.Now()
	g := 0.0
	for time.Since(start) < 3*time.Minute {
		if n, _, err := sidecarRuntime(); err == nil {
			g = n
			if g <= want {
				return g, fmt.Sprintf("%.0f s", time.Since(start).Seconds())
			}
		}
		select {
		case <-ctx.Done():
			return g, "(cut short)"
		case <-time.After(5 * time.Second):
		}
	}
	return g, "3 minutes (never back to the idle count)"
}

func abs(x float64) float64 { return max(x, -x) }

// sidecarRuntime reads go_goroutines and process_resident_memory_bytes
// from the sidecar's metrics listener.
func sidecarRuntime() (goroutines, rss float64, err error) {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "go_goroutines":
			goroutines = v
		case "process_resident_memory_bytes":
			rss = v
		}
	}
	if goroutines == 0 || rss == 0 {
		return 0, 0, fmt.Errorf("no go_goroutines or process_resident_memory_bytes in the sidecar's metrics")
	}
	return goroutines, rss, nil
}
