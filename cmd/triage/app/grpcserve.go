package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/triagegrpc"
)

// grpcService is a long-running gRPC command's server: what it is
// called in logs, where it listens and serves metrics, and how it
// drains.
type grpcService struct {
	name, listen, metrics string
	reg                   *prometheus.Registry
	gs                    *grpc.Server
	lc                    *lifecycle.Lifecycle
	drain                 time.Duration
	log                   *slog.Logger
}

// run listens, serves metrics if asked, prints banner(address) on stdout
// and serves until ctx is done; then lame duck for the drain and a
// bounded graceful stop. It returns the command's exit status.
func (s grpcService) run(ctx context.Context, stdout io.Writer, banner func(net.Addr) string) int {
	lis, err := net.Listen("tcp", s.listen)
	if err != nil {
		s.log.Error(s.name+" cannot listen", "addr", s.listen, "err", err)
		return 1
	}
	if s.metrics != "" {
		stopMetrics, err := serveMetrics(s.metrics, s.reg, s.lc)
		if err != nil {
			lis.Close()
			s.log.Error(s.name+" cannot serve metrics", "addr", s.metrics, "err", err)
			return 1
		}
		defer stopMetrics()
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		s.log.Info("lame duck, then stop", "drain", s.drain)
		sctx, cancel := context.WithTimeout(context.Background(), s.drain+10*time.Second)
		defer cancel()
		s.lc.Shutdown(sctx, triagegrpc.GracefulStop(s.gs))
	}()
	fmt.Fprintln(stdout, banner(lis.Addr()))
	if err := s.gs.Serve(lis); err != nil && !stoppedFirst(ctx, err) {
		s.log.Error(s.name+" stopped", "err", err)
		return 1
	}
	<-stopped
	s.log.Info("stopped")
	return 0
}

// stoppedFirst reports whether Serve's err says only that the stop ctx
// asked for came before Serve began (a SIGTERM during start-up): a clean
// stop.
func stoppedFirst(ctx context.Context, err error) bool {
	return errors.Is(err, grpc.ErrServerStopped) && ctx.Err() != nil
}
