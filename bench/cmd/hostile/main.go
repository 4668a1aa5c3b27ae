// Command hostile runs the sidecar's hostile-peer suite (issue 55)
// against the real `triage sidecar` binary (defaults, loopback trusted):
// for each attack, a fresh sidecar in front of a Go upstream that serves
// gRPC (h2c) and HTTP/1.1 (WebSocket upgrades included), the attack for
// -for, and beside it a well-behaved CRITICAL client calling one at a
// time, a call every 10 ms with a 1 s deadline (a grpc-go EmptyCall for
// the gRPC rows, an HTTP GET for the others). It prints, for each attack,
// the client's calls served during it, the time from the attack's end to
// the first of ten calls in a row served (the recovery), and the
// sidecar's admission state, resident memory and threads at the attack's
// end.
//
//	cd bench && go run ./cmd/hostile [-for 5s] [-only SUBSTRING]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/triagehq/triage/bench/internal/echo"
	"github.com/triagehq/triage/bench/internal/triagebin"
)

var verbose bool

func main() {
	dur := flag.Duration("for", 5*time.Second, "how long each attack runs")
	only := flag.String("only", "", "run only the attacks whose name contains this")
	targets := flag.String("targets", "sidecar,egress,extproc", "what to attack: sidecar (its ingress), egress, extproc")
	bin := flag.String("triage", "", "a triage binary to run (default: build this module's)")
	flag.BoolVar(&verbose, "v", false, "print the sidecar's triage metrics at each attack's end to stderr")
	flag.Parse()
	if err := run(*dur, *only, *bin, *targets); err != nil {
		fmt.Fprintln(os.Stderr, "hostile:", err)
		os.Exit(1)
	}
}

func run(dur time.Duration, only, bin, targets string) error {
	if bin == "" {
		dir, err := os.MkdirTemp("", "hostile")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if bin, err = triagebin.Build(dir); err != nil {
			return err
		}
	}
	if strings.Contains(targets, "egress") {
		defer func() {
			if err := egressRows(bin, dur, only); err != nil {
				fmt.Fprintln(os.Stderr, "hostile:", err)
			}
		}()
	}
	if strings.Contains(targets, "extproc") {
		defer func() {
			if err := procRows(bin, dur, only); err != nil {
				fmt.Fprintln(os.Stderr, "hostile:", err)
			}
		}()
	}
	if !strings.Contains(targets, "sidecar") {
		return nil
	}
	up, stop, err := upstream()
	if err != nil {
		return err
	}
	defer stop()
	fmt.Printf("| attack (%v) | CRITICAL client served during | recovery after | the sidecar at the attack's end |\n|---|---|---|---|\n", dur)
	return printRows(attacks, only, func(a attack) (string, error) { return row(bin, up, a, dur) })
}

// named is a row of the tables.
type named interface{ rowName() string }

func (a attack) rowName() string       { return a.name }
func (a procAttack) rowName() string   { return a.name }
func (a egressAttack) rowName() string { return a.name }

// printRows prints the row of each item whose name contains only.
func printRows[T named](items []T, only string, row func(T) (string, error)) error {
	for _, it := range items {
		if !strings.Contains(it.rowName(), only) {
			continue
		}
		r, err := row(it)
		if err != nil {
			return fmt.Errorf("%s: %w", it.rowName(), err)
		}
		fmt.Println(r)
	}
	return nil
}

// row runs one attack against a fresh sidecar.
func row(bin, up string, a attack, dur time.Duration) (string, error) {
	metrics, err := freeAddr()
	if err != nil {
		return "", err
	}
	sc, err := triagebin.Start(bin, "sidecar", "-upstream", a.upstream+"://"+up, "-listen", "127.0.0.1:0", "-drain", "0s",
		"-trust", "127.0.0.1/32", "-metrics", metrics)
	if err != nil {
		return "", err
	}
	defer sc.Stop()
	call, closeClient, err := client(a.upstream, sc.Addr)
	if err != nil {
		return "", err
	}
	defer closeClient()
	served, err := measure(call, dur, func(ctx context.Context) { a.run(ctx, sc.Addr) }, func() string { return state(metrics, sc.Pid(), true) })
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("| %s | %s |", a.name, served), nil
}

// measure warms the caller, runs attack for dur with the caller calling
// beside it every 10 ms, and returns the table's cells: the calls served
// during it, the recovery after it, and end's state at its end (and the
// first failure, as a comment).
func measure(call func() error, dur time.Duration, attack func(context.Context), end func() string) (string, error) {
	for i := 0; i < 10; i++ { // warm: the connection up, the limit found
		call()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); attack(ctx) }()
	ok, total, firstErr := 0, 0, error(nil)
	tick := time.NewTicker(10 * time.Millisecond)
	for until := time.Now().Add(dur); time.Now().Before(until); {
		total++
		if err := call(); err == nil {
			ok++
		} else if firstErr == nil {
			firstErr = err
		}
		<-tick.C
	}
	tick.Stop()
	st := end()
	cancel()
	<-done
	r := fmt.Sprintf("%d/%d (%.1f%%) | %s | %s", ok, total, 100*float64(ok)/float64(max(total, 1)), recovery(call), st)
	if firstErr != nil {
		r += fmt.Sprintf(" <!-- first failure: %v -->", firstErr)
	}
	return r, nil
}

// recovery is the time from now to the first of ten calls in a row
// served, or "> 15 s".
func recovery(call func() error) string {
	start := time.Now()
	var first time.Time
	streak := 0
	for time.Since(start) < 15*time.Second {
		t := time.Now()
		if call() == nil {
			if streak == 0 {
				first = t
			}
			if streak++; streak == 10 {
				return first.Sub(start).Round(time.Millisecond).String()
			}
		} else {
			streak = 0
		}
		time.Sleep(10 * time.Millisecond)
	}
	return "> 15 s"
}

// client returns the well-behaved CRITICAL client's call for the row's
// upstream: a grpc-go EmptyCall (h2c) or an HTTP GET (http).
func client(scheme, addr string) (call func() error, close func(), err error) {
	if scheme == "h2c" {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, nil, err
		}
		c := testgrpc.NewTestServiceClient(cc)
		return func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := c.EmptyCall(metadata.AppendToOutgoingContext(ctx, "triage-criticality", "CRITICAL"), &testgrpc.Empty{})
			return err
		}, func() { cc.Close() }, nil
	}
	hc := &http.Client{Timeout: time.Second}
	return func() error { return get(hc, addr) }, hc.CloseIdleConnections, nil
}

// get is a CRITICAL GET of addr's root: an error unless answered 200.
func get(hc *http.Client, addr string) error {
	req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
	req.Header.Set("Triage-Criticality", "CRITICAL")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// state reads the sidecar's admission state from its metrics and its
// resident memory from /proc.
func state(addr string, pid int, end ...bool) string {
	final := len(end) > 0
	var parts []string
	if resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + addr + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if verbose && final {
			for _, line := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(line, "triage_") && !strings.HasSuffix(line, " 0") && !strings.Contains(line, "_bucket") {
					fmt.Fprintln(os.Stderr, line)
				}
			}
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 2 {
				f[0], _, _ = strings.Cut(f[0], "{") // the processor's are by cluster
			}
			if len(f) == 2 && slices.Contains([]string{"triage_admission_pending", "triage_admission_executing", "triage_admission_queued", "triage_admission_stalled"}, f[0]) {
				parts = append(parts, strings.TrimPrefix(f[0], "triage_admission_")+" "+f[1])
			}
		}
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && (f[0] == "VmRSS:" || f[0] == "Threads:") {
				parts = append(parts, line)
			}
		}
	}
	return strings.Join(parts, ", ")
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// upstream serves gRPC's EmptyCall (h2c), WebSocket upgrades (held open)
// and any other request ("ok", its body read) on one loopback port.
func upstream() (addr string, stop func(), err error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	gs := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(gs, echo.Server{})
	srv := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc"):
			gs.ServeHTTP(w, r)
		case strings.EqualFold(r.Header.Get("Upgrade"), "websocket"):
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			brw.Flush()
			io.Copy(io.Discard, c)
		default:
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, "ok")
		}
	})}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "upstream:", err)
		}
	}()
	return lis.Addr().String(), func() { srv.Close(); gs.Stop() }, nil
}
