package triagegrpc

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health" // also enables client-side health checking for service configs that ask for it

	"github.com/triagehq/triage/lifecycle"
)

// NewLifecycle returns a lifecycle.Lifecycle whose state hs announces:
// every service NOT_SERVING while the task is in lame duck, which clients
// with healthCheckConfig in their service config learn at once from their
// watch stream, active or idle. Register hs on the grpc.Server with
// healthpb.RegisterHealthServer, and pass the Lifecycle to NewServer with
// WithLifecycle so that every response also carries the triage-lame-duck
// trailer. Call its Shutdown from the SIGTERM handler with GracefulStop:
//
//	lc.Shutdown(ctx, triagegrpc.GracefulStop(grpcServer))
func NewLifecycle(hs *health.Server, opts ...lifecycle.Option) (*lifecycle.Lifecycle, error) {
	if hs == nil {
		return nil, errors.New("triagegrpc: a Lifecycle needs a health.Server")
	}
	l, err := lifecycle.New(opts...)
	if err != nil {
		return nil, err
	}
	l.Subscribe(func(lame bool) {
		if lame {
			hs.Shutdown()
		} else {
			hs.Resume()
		}
	})
	return l, nil
}

// GracefulStop returns the stop function of lifecycle.Lifecycle.Shutdown
// for srv: srv.GracefulStop, which lets requests in flight finish, cut
// short by srv.Stop when the context ends first (a health Watch from a
// client that never closes it, a long stream).
func GracefulStop(srv *grpc.Server) func(context.Context) error {
	return func(ctx context.Context) error {
		done := make(chan struct{})
		go func() {
			srv.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			srv.Stop()
			<-done
			return ctx.Err()
		}
	}
}
