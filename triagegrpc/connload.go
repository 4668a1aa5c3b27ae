package triagegrpc

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	"github.com/triagehq/triage/connload"
)

// WithConnLoad returns the server option that reports the server's
// connections to l (connload.Listener.Track): serve l itself, and install
// the option, so that gRPC-Go gets bare connections, which it reads
// without pinning a buffer per idle connection, while l still counts them
// and bounds them.
//
//	cl, _ := connload.NewListener(lis)
//	srv := grpc.NewServer(append(ts.ServerOptions(), triagegrpc.WithConnLoad(cl))...)
//	srv.Serve(cl)
func WithConnLoad(l *connload.Listener) grpc.ServerOption {
	begin, end := l.Track()
	return grpc.StatsHandler(connStats{begin: begin, end: end})
}

// connStats counts connections from gRPC's connection events.
type connStats struct{ begin, end func() }

func (connStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (connStats) HandleRPC(context.Context, stats.RPCStats)                         {}
func (connStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (c connStats) HandleConn(_ context.Context, s stats.ConnStats) {
	switch s.(type) {
	case *stats.ConnBegin:
		c.begin()
	case *stats.ConnEnd:
		c.end()
	}
}
