// Command ghzserver is the backend of issue 20's stock-client check: a
// grpc-go server of grpc.testing.TestService whose EmptyCall burns a
// calibrated CPU cost, with server reflection so that stock tools (ghz,
// grpcurl) can call it, protected as the README shows
// (triagegrpc.NewServer(WithTrust(127.0.0.1/32), WithAdmission(admission.New())))
// or not. Run it on one CPU and ghz on the other; it serves on loopback
// until interrupted:
//
//	taskset -c 0 env GOMAXPROCS=1 go run ./cmd/ghzserver -protect=false   # capacity C:
//	taskset -c 1 ghz --insecure --call grpc.testing.TestService/EmptyCall -c 50 --connections 8 -z 10s 127.0.0.1:50051
//	taskset -c 0 env GOMAXPROCS=1 go run ./cmd/ghzserver                  # protected, then ~10x:
//	taskset -c 1 ghz --insecure --call grpc.testing.TestService/EmptyCall --rps 10C -c 3000 --connections 8 \
//	    --timeout 1s -z 10s -m '{"triage-criticality":"CRITICAL"}' 127.0.0.1:50051
package main

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/reflection"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/bench/internal/burn"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

type service struct {
	testgrpc.UnimplementedTestServiceServer
	rounds int
}

func (s *service) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	var sum [32]byte
	for i := 0; i < s.rounds; i++ {
		sum = sha256.Sum256(sum[:])
	}
	if sum[0] == 1 && sum[1] == 2 && sum[2] == 3 {
		fmt.Fprint(os.Stderr, "") // keep the work
	}
	return &testgrpc.Empty{}, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:50051", "listen address (loopback)")
	cost := flag.Duration("cost", time.Millisecond, "CPU each EmptyCall burns")
	protect := flag.Bool("protect", true, "triage's server with admission control, as the README shows")
	flag.Parse()
	host, _, err := net.SplitHostPort(*listen)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		fmt.Fprintln(os.Stderr, "ghzserver: -listen must be a loopback address")
		os.Exit(2)
	}
	var opts []grpc.ServerOption
	if *protect {
		ctl, err := admission.New()
		if err != nil {
			fmt.Fprintln(os.Stderr, "ghzserver:", err)
			os.Exit(1)
		}
		srv, err := triagegrpc.NewServer(triagegrpc.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})), triagegrpc.WithAdmission(ctl))
		if err != nil {
			fmt.Fprintln(os.Stderr, "ghzserver:", err)
			os.Exit(1)
		}
		opts = srv.ServerOptions()
	}
	s := grpc.NewServer(opts...)
	testgrpc.RegisterTestServiceServer(s, &service{rounds: burn.Calibrate(*cost)})
	reflection.Register(s)
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ghzserver:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); s.Stop() }()
	fmt.Printf("ghzserver on %s (protect=%v, cost %v)\n", lis.Addr(), *protect, *cost)
	if err := s.Serve(lis); err != nil {
		fmt.Fprintln(os.Stderr, "ghzserver:", err)
		os.Exit(1)
	}
}
