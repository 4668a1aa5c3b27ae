// Command proxycpu measures what a proxy in front of a service costs in
// CPU (issue 56, item 3): `triage sidecar` with its defaults, HAProxy and
// nginx as the polyglot bench configures them, each alone on CPU 0
// (GOMAXPROCS=1, one thread, one worker), a Go upstream and wrk on CPU 1.
// Each proxy is measured the same way, in alternate rounds:
//
//   - forward: wrk with 4 connections (fewer than any proxy's limit, so
//     nothing is refused) on a path the upstream answers at once; the
//     proxy's CPU time over the run divided by the 2xx answers;
//   - refuse: wrk with 64 connections on a path the upstream holds for a
//     minute, so that its slots fill and every other request is refused;
//     each proxy refuses at once (the sidecar's -max-wait 1ms, HAProxy's
//     timeout queue 1ms, nginx's limit_conn); the proxy's CPU time over
//     the run divided by the 503 answers.
//
// CPU is read from /proc (user + system) before and after each run.
//
//	cd bench && go run ./cmd/proxycpu -rounds 3
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/triagehq/triage/bench/internal/child"
	"github.com/triagehq/triage/bench/internal/stockproxy"
	"github.com/triagehq/triage/bench/internal/triagebin"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "upstream" {
		if err := upstream(); err != nil {
			fmt.Fprintln(os.Stderr, "proxycpu upstream:", err)
			os.Exit(1)
		}
		return
	}
	if err := drive(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "proxycpu:", err)
		os.Exit(1)
	}
}

// upstream answers "/" at once and holds "/hold" for a minute.
func upstream() error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("LISTEN %s\n", lis.Addr())
	ok := []byte("ok\n")
	return http.Serve(lis, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			select {
			case <-r.Context().Done():
			case <-time.After(time.Minute):
			}
		}
		w.Write(ok)
	}))
}

type mode struct {
	name  string
	path  string
	conns int
}

var modes = []mode{{"forward", "/", 4}, {"refuse", "/hold", 64}}

func drive(args []string) error {
	fs := flag.NewFlagSet("proxycpu", flag.ContinueOnError)
	rounds := fs.Int("rounds", 3, "rounds; each measures every proxy in both modes")
	dur := fs.Duration("for", 8*time.Second, "each wrk run's length")
	proxies := fs.String("proxies", "sidecar,haproxy,nginx", "proxies to measure")
	bin := fs.String("triage", "", "the triage binary to measure (default: built from this module)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *rounds < 1 || *rounds > 20 {
		return fmt.Errorf("-rounds must be in [1, 20], got %d", *rounds)
	}
	for _, tool := range []string{"wrk", "taskset"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is needed: %v", tool, err)
		}
	}
	dir, err := os.MkdirTemp("", "proxycpu")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	triage := *bin
	if triage == "" {
		if triage, err = triagebin.Build(dir); err != nil {
			return err
		}
	}
	fmt.Println("proxy    mode     round  answered  2xx/s    503/s    proxy CPU s  µs per answer")
	for r := range *rounds {
		for _, px := range strings.Split(*proxies, ",") {
			for _, m := range modes {
				res, err := measure(triage, dir, px, m, *dur)
				if err != nil {
					return fmt.Errorf("%s %s: %w", px, m.name, err)
				}
				n := res.ok
				if m.name == "refuse" {
					n = res.refused
				}
				per := 0.0
				if n > 0 {
					per = res.cpu / float64(n) * 1e6
				}
				fmt.Printf("%-8s %-8s %5d  %8d  %7.0f  %7.0f  %11.2f  %13.1f\n", px, m.name, r+1, n,
					float64(res.ok)/dur.Seconds(), float64(res.refused)/dur.Seconds(), res.cpu, per)
			}
		}
	}
	return nil
}

type result struct {
	ok, refused int
	cpu         float64
}

// measure starts a fresh upstream and proxy, runs wrk through it, and
// returns the answers and the proxy's CPU seconds over wrk's run.
func measure(triage, dir, px string, m mode, d time.Duration) (result, error) {
	up, err := child.Start("1", "upstream")
	if err != nil {
		return result{}, err
	}
	defer up.Stop()
	listen, err := freePort()
	if err != nil {
		return result{}, err
	}
	argv, err := proxyArgv(triage, dir, px, up.Addr, listen)
	if err != nil {
		return result{}, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, "taskset", append([]string{"-c", "0"}, argv...)...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	logf, err := os.Create(filepath.Join(dir, px+".log"))
	if err != nil {
		return result{}, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return result{}, err
	}
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}()
	if err := waitFor(listen); err != nil {
		return result{}, err
	}
	// A warm-up: the proxy's first connections and the upstream's.
	if _, err := wrk(listen, "/", 4, time.Second); err != nil {
		return result{}, err
	}
	before := child.GroupCPU(cmd.Process.Pid)
	out, err := wrk(listen, m.path, m.conns, d)
	if err != nil {
		return result{}, err
	}
	cpu := child.GroupCPU(cmd.Process.Pid) - before
	total, non2xx, err := parseWrk(out)
	if err != nil {
		return result{}, err
	}
	return result{ok: total - non2xx, refused: non2xx, cpu: cpu}, nil
}

// wrk runs wrk on CPU 1 against addr and returns its report.
func wrk(addr, path string, conns int, d time.Duration) (string, error) {
	cmd := exec.Command("taskset", "-c", "1", "wrk", "-t1", "-c"+strconv.Itoa(conns), "-d"+d.String(), "--timeout", "90s",
		"-H", "Triage-Criticality: CRITICAL", "http://"+addr+path)
	b, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("wrk: %v\n%s", err, b)
	}
	return string(b), nil
}

var (
	wrkTotal  = regexp.MustCompile(`(\d+) requests in`)
	wrkNon2xx = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
)

// parseWrk returns the requests wrk completed and how many were not 2xx.
func parseWrk(out string) (total, non2xx int, err error) {
	m := wrkTotal.FindStringSubmatch(out)
	if m == nil {
		return 0, 0, fmt.Errorf("no request count in wrk's report:\n%s", out)
	}
	total, _ = strconv.Atoi(m[1])
	if m := wrkNon2xx.FindStringSubmatch(out); m != nil {
		non2xx, _ = strconv.Atoi(m[1])
	}
	return total, non2xx, nil
}

// proxyArgv writes the proxy's configuration into dir and returns its
// command line.
func proxyArgv(triage, dir, px, up, listen string) ([]string, error) {
	switch px {
	case "sidecar":
		return []string{triage, "sidecar", "-upstream", "http://" + up, "-listen", listen, "-trust", "127.0.0.1/32", "-max-wait", "1ms"}, nil
	case "haproxy", "nginx":
		return stockproxy.Argv(px, stockproxy.Config{Upstream: up, Listen: listen, Dir: dir, Conns: 4, Maxconn: 2, Queue: time.Millisecond})
	}
	return nil, fmt.Errorf("unknown proxy %q", px)
}

// freePort returns a loopback address no one listens on now.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// waitFor waits until addr accepts connections, for at most 10 s.
func waitFor(addr string) error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
	}
	return errors.New(addr + " never answered")
}
