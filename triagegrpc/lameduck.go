package triagegrpc

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health" // also enables client-side health checking for service configs that ask for it
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

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

// LivenessService is the health service name for a liveness probe (in
// Kubernetes, a grpc probe's service): HealthServer answers it SERVING
// whenever the process answers at all, in warm-up and lame duck too. The
// readiness probe asks for the service "" (or one of yours), which
// NewLifecycle turns NOT_SERVING in warm-up and lame duck.
const LivenessService = "triage.liveness"

// HealthServer returns hs's health service with one more name,
// LivenessService, that is always SERVING. Register it in place of hs:
//
//	healthpb.RegisterHealthServer(s, triagegrpc.HealthServer(hs))
func HealthServer(hs *health.Server) healthpb.HealthServer { return liveness{hs} }

// liveness adds LivenessService to a health.Server.
type liveness struct{ *health.Server }

var serving = &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}

func (l liveness) Check(ctx context.Context, r *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if r.GetService() == LivenessService {
		return serving, nil
	}
	return l.Server.Check(ctx, r)
}

// Watch sends SERVING once for LivenessService and holds the stream until
// the client or the server ends it, as health.Server does for the others.
func (l liveness) Watch(r *healthpb.HealthCheckRequest, stream grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	if r.GetService() != LivenessService {
		return l.Server.Watch(r, stream)
	}
	if err := stream.Send(serving); err != nil {
		return err
	}
	<-stream.Context().Done()
	return stream.Context().Err()
}

func (l liveness) List(ctx context.Context, r *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	resp, err := l.Server.List(ctx, r)
	if err == nil {
		if resp.Statuses == nil {
			resp.Statuses = map[string]*healthpb.HealthCheckResponse{}
		}
		resp.Statuses[LivenessService] = serving
	}
	return resp, err
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
