// Command frontendload checks the drill's HTTP frontend against a
// saturated client population (issue 20): wrk, the stock HTTP load tool,
// on one CPU with 50 and then 2,000 keep-alive connections in a closed
// loop, against the drill's whole stack (frontend, tiers A and B, the DB,
// the quota service: `triage demo -stack with|without`) pinned to the
// other CPU. Each run starts a fresh stack; the figures are medians of
// -repeats runs. It reports the OK answers a second (the frontend's 200s),
// every answer a second, the frontend's CPU (of CPU 0, which it shares
// with the rest of the stack) and peak resident memory (sampled every
// 100 ms from /proc), and whether it survived.
//
//	apt-get install wrk
//	cd bench && go run ./cmd/frontendload
//	cd bench && go run ./cmd/frontendload -conns 50,500,2000 -stacks with -repeats 5
//
// All traffic stays on 127.0.0.1 and every run is bounded in time.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/triagehq/triage/bench/internal/child"
	"github.com/triagehq/triage/internal/measure"

	"github.com/triagehq/triage/bench/internal/triagebin"
)

type config struct {
	triage, wrk   string
	conns         []int
	stacks        []string
	repeats       int
	duration      time.Duration
	path, apiKey  string
	clientTimeout time.Duration
}

func main() {
	var c config
	var conns, stacks string
	fs := flag.NewFlagSet("frontendload", flag.ExitOnError)
	fs.StringVar(&c.triage, "triage", "", "the triage binary (empty: build ../cmd/triage)")
	fs.StringVar(&c.wrk, "wrk", "wrk", "the wrk binary (apt-get install wrk)")
	fs.StringVar(&conns, "conns", "50,2000", "wrk's connections, one row each")
	fs.StringVar(&stacks, "stacks", "with,without", "the stacks: with and/or without triage")
	fs.IntVar(&c.repeats, "repeats", 3, "runs per row, each on a fresh stack; figures are medians")
	fs.DurationVar(&c.duration, "d", 15*time.Second, "length of each wrk run")
	fs.StringVar(&c.path, "path", "/search", "the path every request asks for (/search: CRITICAL)")
	fs.StringVar(&c.apiKey, "key", "key-gmail", "the X-Api-Key header (the customer)")
	fs.DurationVar(&c.clientTimeout, "timeout", 2*time.Second, "wrk's per-request timeout")
	fs.Parse(os.Args[1:])
	if err := run(c, conns, stacks); err != nil {
		fmt.Fprintln(os.Stderr, "frontendload:", err)
		os.Exit(1)
	}
}

func run(c config, conns, stacks string) error {
	var err error
	if c.conns, err = parseConns(conns); err != nil {
		return err
	}
	for _, s := range strings.Split(stacks, ",") {
		if s != "with" && s != "without" {
			return fmt.Errorf("-stacks: want with and/or without, got %q", s)
		}
		c.stacks = append(c.stacks, s)
	}
	switch {
	case c.repeats < 1 || c.repeats > 20:
		return fmt.Errorf("-repeats must be in [1, 20], got %d", c.repeats)
	case c.duration < 2*time.Second || c.duration > 5*time.Minute || c.duration%time.Second != 0:
		return fmt.Errorf("-d must be whole seconds in [2s, 5m] (wrk's unit), got %v", c.duration)
	case c.clientTimeout < time.Second || c.clientTimeout > time.Minute || c.clientTimeout%time.Second != 0:
		return fmt.Errorf("-timeout must be whole seconds in [1s, 1m] (wrk's unit), got %v", c.clientTimeout)
	case !strings.HasPrefix(c.path, "/"):
		return fmt.Errorf("-path must start with /, got %q", c.path)
	}
	if c.wrk, err = exec.LookPath(c.wrk); err != nil {
		return fmt.Errorf("%v: install it with apt-get install wrk", err)
	}
	if c.triage == "" {
		dir, err := os.MkdirTemp("", "frontendload")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if c.triage, err = triagebin.Build(dir); err != nil {
			return err
		}
	}
	fmt.Printf("wrk -t1 -c N -d %v --timeout %v -H 'X-Api-Key: %s' FRONTEND%s on CPU 1; the drill's stack on CPU 0; medians of %d runs\n\n",
		c.duration, c.clientTimeout, c.apiKey, c.path, c.repeats)
	fmt.Printf("%-8s %6s %8s %10s %9s %11s %13s %13s  %s\n", "STACK", "CONNS", "OK/s", "ANSWERS/s", "OK_SHARE", "TIMEOUTS/s", "FRONTEND_CPU", "FRONTEND_RSS", "frontend alive after (runs)")
	for _, stack := range c.stacks {
		for _, n := range c.conns {
			var ok, answers, share, timeouts, rss, cpu []float64
			alive := 0
			for i := 0; i < c.repeats; i++ {
				r, err := runOnce(c, stack, n)
				if err != nil {
					return err
				}
				ok, answers, timeouts, rss = append(ok, r.okPerSec), append(answers, r.answersPerSec), append(timeouts, r.timeoutsPerSec), append(rss, float64(r.peakRSS))
				share = append(share, r.okPerSec/max(r.answersPerSec, 1e-9))
				cpu = append(cpu, r.frontendCPU)
				if r.alive {
					alive++
				}
			}
			fmt.Printf("%-8s %6d %8.0f %10.0f %8.1f%% %11.0f %12.0f%% %10.0f MB  %d/%d\n", stack, n, measure.Median(ok), measure.Median(answers), 100*measure.Median(share), measure.Median(timeouts), 100*measure.Median(cpu), measure.Median(rss)/(1<<20), alive, c.repeats)
		}
	}
	return nil
}

func parseConns(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 10000 {
			return nil, fmt.Errorf("-conns: want numbers in [1, 10000], got %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// result is one wrk run against a fresh stack.
type result struct {
	okPerSec, answersPerSec, timeoutsPerSec float64
	peakRSS                                 int64   // bytes
	frontendCPU                             float64 // of a core
	alive                                   bool
}

// runOnce starts a stack pinned to CPU 0, runs wrk on CPU 1 against its
// frontend while sampling the frontend's memory, and stops the stack.
func runOnce(c config, stack string, conns int) (result, error) {
	var r result
	hold := c.duration + 30*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), hold+30*time.Second)
	defer cancel()
	argv := []string{c.triage, "demo", "-stack", stack, "-hold", hold.String()}
	if ts, err := exec.LookPath("taskset"); err == nil {
		argv = append([]string{ts, "-c", "0"}, argv...)
	}
	demo := exec.CommandContext(ctx, argv[0], argv[1:]...)
	demo.Cancel = func() error { return demo.Process.Signal(syscall.SIGINT) }
	demo.WaitDelay = 10 * time.Second
	out, err := demo.StdoutPipe()
	if err != nil {
		return r, err
	}
	demo.Stderr = os.Stderr
	if err := demo.Start(); err != nil {
		return r, err
	}
	defer func() { cancel(); demo.Wait() }()
	front, err := frontendURL(bufio.NewScanner(out))
	if err != nil {
		return r, err
	}
	u, err := url.Parse(front)
	if err != nil || !loopback(u.Hostname()) {
		return r, fmt.Errorf("the stack's frontend %q is not on loopback", front)
	}
	pid, err := findServer("-listen " + u.Host)
	if err != nil {
		return r, err
	}
	time.Sleep(2 * time.Second) // the stack's connections settle
	samples := make(chan int64)
	stop := make(chan struct{})
	go func() {
		var peak int64
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if v := rss(pid); v > peak {
				peak = v
			}
			select {
			case <-t.C:
			case <-stop:
				samples <- peak
				return
			}
		}
	}()
	wargs := []string{"-t1", "-c" + strconv.Itoa(conns), "-d" + strconv.Itoa(int(c.duration.Seconds())) + "s",
		"--timeout", strconv.Itoa(int(c.clientTimeout.Seconds())) + "s", "-H", "X-Api-Key: " + c.apiKey, front + c.path}
	name := c.wrk
	if ts, err := exec.LookPath("taskset"); err == nil {
		wargs = append([]string{"-c", "1", c.wrk}, wargs...)
		name = ts
	}
	cpu0, wall0 := child.ProcessCPU(pid), time.Now()
	w, err := exec.Command(name, wargs...).CombinedOutput()
	r.frontendCPU = (child.ProcessCPU(pid) - cpu0) / time.Since(wall0).Seconds()
	close(stop)
	r.peakRSS = <-samples
	if err != nil {
		return r, fmt.Errorf("wrk: %v: %s", err, w)
	}
	if r.okPerSec, r.answersPerSec, r.timeoutsPerSec, err = parseWrk(string(w)); err != nil {
		return r, err
	}
	_, serr := os.Stat(fmt.Sprintf("/proc/%d", pid))
	r.alive = serr == nil && rss(pid) > 0
	return r, nil
}

var urlLine = regexp.MustCompile(`frontend (http://[^ ]+)`)

// frontendURL reads the demo's output until it names the frontend.
func frontendURL(sc *bufio.Scanner) (string, error) {
	for sc.Scan() {
		if m := urlLine.FindStringSubmatch(sc.Text()); m != nil {
			go func() {
				for sc.Scan() {
				}
			}()
			return m[1], nil
		}
	}
	return "", errors.New("the stack did not print its frontend's address")
}

func loopback(host string) bool { return host == "127.0.0.1" || host == "::1" || host == "localhost" }

// findServer returns the pid of the process whose command line contains
// arg (the frontend's "-listen ADDR", unique to its stack).
func findServer(arg string) (int, error) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, " serve frontend ") && strings.Contains(cmd, arg+" ") {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no frontend process with %q", arg)
}

// rss returns the resident memory of pid in bytes (measure.RSS), 0 if it
// is gone.
func rss(pid int) int64 {
	n, _ := measure.RSS(pid)
	return n
}

var (
	reqLine     = regexp.MustCompile(`(\d+) requests in ([\d.]+)(ms|s|m)`)
	non2xxLine  = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
	timeoutLine = regexp.MustCompile(`Socket errors: .*timeout (\d+)`)
)

// parseWrk reads wrk's summary: OK answers, all answers and timeouts, a
// second.
func parseWrk(out string) (ok, answers, timeouts float64, err error) {
	m := reqLine.FindStringSubmatch(out)
	if m == nil {
		return 0, 0, 0, fmt.Errorf("wrk's output has no request count: %s", out)
	}
	n, _ := strconv.ParseFloat(m[1], 64)
	secs, _ := strconv.ParseFloat(m[2], 64)
	switch m[3] {
	case "ms":
		secs /= 1000
	case "m":
		secs *= 60
	}
	if secs <= 0 {
		return 0, 0, 0, fmt.Errorf("wrk ran for %s", m[2]+m[3])
	}
	var bad, to float64
	if m := non2xxLine.FindStringSubmatch(out); m != nil {
		bad, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := timeoutLine.FindStringSubmatch(out); m != nil {
		to, _ = strconv.ParseFloat(m[1], 64)
	}
	return (n - bad) / secs, n / secs, to / secs, nil
}
