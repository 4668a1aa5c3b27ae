// Package echo is the benchmarks' gRPC upstream: grpc.testing's
// EmptyCall, answered at once, and FullDuplexCall, one answer for each
// message until the client's end.
package echo

import (
	"context"

	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// Server is the upstream. The zero value is ready to register.
type Server struct {
	testgrpc.UnimplementedTestServiceServer
}

// EmptyCall answers at once.
func (Server) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

// FullDuplexCall answers each message until the client's end.
func (Server) FullDuplexCall(s testgrpc.TestService_FullDuplexCallServer) error {
	for {
		if _, err := s.Recv(); err != nil {
			return nil
		}
		if err := s.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
}
