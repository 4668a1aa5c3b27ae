// Package burn is the benchmarks' CPU-bound backend: a gRPC method that
// burns a calibrated number of sha256 rounds per call, so that a call
// costs a known CPU time on this machine.
package burn

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Method is the full name of the burning method; requests and responses
// are wrapperspb.StringValue.
const Method = "/triage.bench.Burn/Burn"

// Register registers the method on s, each call burning rounds rounds
// (through s's interceptors).
func Register(s *grpc.Server, rounds int) { RegisterFunc(s, func(string) int { return rounds }) }

// RegisterFunc registers the method on s, each call burning the rounds
// that rounds returns for the request's body.
func RegisterFunc(s *grpc.Server, rounds func(body string) int) {
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "triage.bench.Burn",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Burn", Handler: func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			req := new(wrapperspb.StringValue)
			if err := dec(req); err != nil {
				return nil, err
			}
			n := rounds(req.Value)
			h := func(ctx context.Context, _ any) (any, error) {
				return wrapperspb.String(strconv.Itoa(int(Rounds(n)))), nil
			}
			if in == nil {
				return h(ctx, req)
			}
			return in(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: Method}, h)
		}}},
	}, struct{}{})
}

// Rounds burns n sha256 rounds and returns a byte of the last sum, so
// that the work is not optimised away.
func Rounds(n int) byte {
	var sum [32]byte
	for i := 0; i < n; i++ {
		sum = sha256.Sum256(sum[:])
	}
	return sum[0]
}

// Calibrate returns the sha256 rounds that take cost of CPU here: the best
// of 20 timings.
func Calibrate(cost time.Duration) int {
	var sum [32]byte
	best := time.Duration(1 << 62)
	const n = 20000
	for range 20 {
		start := time.Now()
		for i := 0; i < n; i++ {
			sum = sha256.Sum256(sum[:])
		}
		best = min(best, time.Since(start))
	}
	if sum[0] == 0 && sum[1] == 0 {
		fmt.Fprint(io.Discard, sum) // keep the work
	}
	return max(1, int(float64(n)*float64(cost)/float64(best)))
}
