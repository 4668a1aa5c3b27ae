// Command zerowindow runs issue 55's zero-window attack against the real
// `triage sidecar` binary (defaults, loopback trusted) in front of a plain
// grpc-go server: conns HTTP/2 connections that grant no flow-control
// window send calls unary gRPC calls each and never read; a well-behaved
// grpc-go client's CRITICAL_PLUS EmptyCall is counted beside them and
// right after they close.
//
//	cd bench && go run ./cmd/zerowindow -conns 4,8,16 -calls 30
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/triagehq/triage/bench/internal/echo"
	"github.com/triagehq/triage/bench/internal/triagebin"
	"github.com/triagehq/triage/internal/testkit/h2attack"
)

func main() {
	conns := flag.String("conns", "4,8,16", "attacking connections per row")
	calls := flag.Int("calls", 30, "calls per attacking connection")
	bin := flag.String("triage", "", "a triage binary to run (default: build this module's)")
	trustNet := flag.String("trust", "127.0.0.1/32", "the sidecar's -trust: the good client's CRITICAL_PLUS is believed from it; empty: nobody's (the client is then CRITICAL, as the attackers)")
	flag.Parse()
	if err := run(*conns, *calls, *bin, *trustNet); err != nil {
		fmt.Fprintln(os.Stderr, "zerowindow:", err)
		os.Exit(1)
	}
}

func run(connsList string, calls int, bin, trustNet string) error {
	if bin == "" {
		dir, err := os.MkdirTemp("", "zerowindow")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if bin, err = triagebin.Build(dir); err != nil {
			return err
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	gs := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(gs, echo.Server{})
	go gs.Serve(lis)
	defer gs.Stop()
	for _, f := range strings.Split(connsList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 256 {
			return fmt.Errorf("bad -conns entry %q", f)
		}
		if err := row(bin, lis.Addr().String(), trustNet, n, calls); err != nil {
			return err
		}
	}
	return nil
}

// row starts a fresh sidecar, attacks it with n connections, and counts
// the good client's calls beside the attack and right after it.
func row(bin, upstream, trustNet string, n, calls int) error {
	args := []string{"sidecar", "-upstream", "h2c://" + upstream, "-listen", "127.0.0.1:0", "-drain", "0s"}
	if trustNet != "" {
		args = append(args, "-trust", trustNet)
	}
	sc, err := triagebin.Start(bin, args...)
	if err != nil {
		return err
	}
	defer sc.Stop()
	addr := sc.Addr
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	client := testgrpc.NewTestServiceClient(cc)
	served := func(k int) int {
		ok := 0
		var failed []string
		for i := range k {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			md := metadata.Pairs("triage-criticality", "CRITICAL_PLUS")
			if _, err := client.EmptyCall(metadata.NewOutgoingContext(ctx, md), &testgrpc.Empty{}); err == nil {
				ok++
			} else if len(failed) < 3 {
				failed = append(failed, fmt.Sprintf("call %d: %v", i, err))
			}
			cancel()
		}
		if len(failed) > 0 {
			fmt.Printf("  failures (first 3): %s\n", strings.Join(failed, "; "))
		}
		return ok
	}
	stop, err := h2attack.ZeroWindowGRPC(addr, "/grpc.testing.TestService/EmptyCall", n, calls)
	if err != nil {
		return err
	}
	beside := served(50)
	stop()
	after := served(50)
	fmt.Printf("%d connections x %d calls with no window: CRITICAL_PLUS served %d/50 beside them, %d/50 right after\n", n, calls, beside, after)
	return nil
}
