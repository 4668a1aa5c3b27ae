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
// and bounds them. It also reports each connection's calls (which tell
// busy connections from idle ones) and each health check answered (a
// grpc.health.v1.Health Check, or a Watch opened; a Watch stream is not a
// call).
//
//	cl, _ := connload.NewListener(lis)
//	srv := grpc.NewServer(append(ts.ServerOptions(), triagegrpc.WithConnLoad(cl))...)
//	srv.Serve(cl)
func WithConnLoad(l *connload.Listener) grpc.ServerOption {
	return grpc.StatsHandler(connStats{l: l, t: l.Track()})
}

// connStats counts connections, calls and health checks from gRPC's
// events. A connection's handle rides in its context; an RPC's events see
// it through theirs. A health watch's context carries a mark, so that its
// end is not counted as a call's.
type connStats struct {
	l *connload.Listener
	t *connload.Tracker
}

type (
	connKey  struct{}
	watchKey struct{}
)

func (c connStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, new(*connload.Conn))
}

func (c connStats) HandleConn(ctx context.Context, s stats.ConnStats) {
	h, _ := ctx.Value(connKey{}).(**connload.Conn)
	if h == nil {
		return
	}
	switch s.(type) {
	case *stats.ConnBegin:
		*h = c.t.Open()
	case *stats.ConnEnd:
		if *h != nil {
			(*h).Close()
		}
	}
}

func (c connStats) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if isHealthCheck(info.FullMethodName) {
		c.l.HealthCheck()
		if info.FullMethodName == healthWatch {
			return context.WithValue(ctx, watchKey{}, true)
		}
	}
	return ctx
}

// HandleRPC counts a call from its Begin to its End, which grpc-go sends
// in pairs; a stream to an unknown method gets neither (it gets a TagRPC
// only), so it never counts as a call in flight.
func (c connStats) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if ctx.Value(watchKey{}) != nil {
		return
	}
	h, _ := ctx.Value(connKey{}).(**connload.Conn)
	if h == nil || *h == nil {
		return
	}
	switch s.(type) {
	case *stats.Begin:
		(*h).CallBegin()
	case *stats.End:
		(*h).CallEnd()
	}
}
