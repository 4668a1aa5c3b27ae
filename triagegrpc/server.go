package triagegrpc

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/petermattis/goid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/connload"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/loadreport"
	"github.com/triagehq/triage/outcome"
)

// Server is the server side of the gRPC adapter: a tap handle and
// interceptors that translate between grpc-go and an intake.Intake, which
// owns the policy (trust, classification, decay, customer, isolation,
// quotas, admission). A Server is safe for concurrent use and keeps no
// per-request state beyond the request's own context.
type Server struct {
	in       *intake.Intake
	trailers *trailers // nil without load reports and lifecycle
	// rejections holds the status error of every admission rejection,
	// built once in compact form (see compactStatus), so that rejecting
	// allocates nothing in triage and as little as possible in grpc-go;
	// outOfQuota and blackHole likewise.
	rejections [admission.NumReasons][2]error
	outOfQuota error
	blackHole  error
	// retryLater holds the status errors of the rejections that carry a
	// RetryAfter (admission.WithRetryAfter), built on first use, keyed by
	// the Controller's prebuilt error: at most maxRetryLater entries.
	retryLater      sync.Map
	retryLaterCount atomic.Int32
	group           func(context.Context, metadata.MD) string
	stats           *streamStats
	clock           clock.Clock
	since           func() time.Duration
}

// ServerOption configures a Server.
type ServerOption interface{ applyServer(*serverConfig) }

type serverConfig struct {
	intake    []intake.Option
	meter     *loadreport.Meter
	lifecycle *lifecycle.Lifecycle
	clock     clock.Clock
	group     func(context.Context, metadata.MD) string
	connLoad  *connload.Listener
}

type serverOptionFunc func(*serverConfig)

func (f serverOptionFunc) applyServer(c *serverConfig) { f(c) }

// WithIntake passes options to the server's intake (intake.New): whom to
// trust, how to classify, admission control, quotas, shadow mode, the
// tracer, isolation and the connection policy are all intake's options.
func WithIntake(opts ...intake.Option) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.intake = append(c.intake, opts...) })
}

// WithGroup supplies the user group for the classifier's group rules,
// from the stream's context (its peer) and its header metadata. It is
// called only when the classifier has a group rule. Default: no group.
func WithGroup(f func(ctx context.Context, md metadata.MD) string) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.group = f })
}

// WithLoadReports makes every response carry the task's load report from
// m (queries and errors per second, utilization) in ORCA's per-call format,
// the endpoint-load-metrics-bin trailer, for weighted round robin in
// triage's balancer or grpc-go's weighted_round_robin. The interceptors
// record each call's outcome in m. Default: none.
func WithLoadReports(m *loadreport.Meter) ServerOption {
	return serverOptionFunc(func(sc *serverConfig) { sc.meter = m })
}

// WithLifecycle makes every response carry triage-lame-duck: 1 while l is
// in lame duck. Default: none.
func WithLifecycle(l *lifecycle.Lifecycle) ServerOption {
	return serverOptionFunc(func(sc *serverConfig) { sc.lifecycle = l })
}

// WithServerClock sets the clock of the Server's own timing (how often the
// load report trailer is rebuilt, when a criticality decay starts or
// falls due). Default clock.Real().
func WithServerClock(c clock.Clock) ServerOption {
	return serverOptionFunc(func(sc *serverConfig) { sc.clock = c; sc.intake = append(sc.intake, intake.WithClock(c)) })
}

// NewServer returns a Server, or an error for an inconsistent
// configuration.
func NewServer(opts ...ServerOption) (*Server, error) {
	var c serverConfig
	for _, o := range opts {
		o.applyServer(&c)
	}
	in, err := intake.New(c.intake...)
	if err != nil {
		return nil, fmt.Errorf("triagegrpc: %w", err)
	}
	clk := clock.OrReal(c.clock)
	s := &Server{in: in, group: c.group, clock: clk, since: clock.SinceFunc(clk, clk.Now()),
		blackHole: compactStatus(isolate.ErrBlackHoled).Err()}
	s.outOfQuota = compactStatus(&outcome.Error{Kind: outcome.OutOfQuota, Reason: "customer over quota", RetryAfter: time.Second}).Err()
	s.stats = &streamStats{}
	if c.connLoad != nil {
		s.stats.load, s.stats.tracker = c.connLoad, c.connLoad.Track()
	}
	if t := (&trailers{meter: c.meter, lifecycle: c.lifecycle, since: s.since}); t.enabled() {
		s.trailers = t
	}
	for r := admission.Reason(0); r < admission.NumReasons; r++ {
		s.rejections[r][0] = compactStatus(&outcome.Error{Kind: outcome.TaskOverloaded, Reason: r.String()}).Err()
		s.rejections[r][1] = compactStatus(&outcome.Error{Kind: outcome.DontRetry, Reason: r.String()}).Err()
	}
	return s, nil
}

// rejection returns the prebuilt status error of an admission rejection.
func (s *Server) rejection(err error) error {
	if r, dr, ok := admission.RejectionOf(err); ok {
		if oe := err.(*outcome.Error); oe.RetryAfter > 0 {
			return s.retryLaterStatus(oe)
		}
		i := 0
		if dr {
			i = 1
		}
		return s.rejections[r][i]
	}
	if err == isolate.ErrBlackHoled {
		return s.blackHole
	}
	if oe, ok := outcome.As(err); ok && oe.Kind == outcome.OutOfQuota {
		return s.outOfQuota
	}
	return ToError(err)
}

// maxRetryLater bounds Server.retryLater: more than every prebuilt
// rejection of a dozen Controllers (under 300 each at the defaults).
const maxRetryLater = 4096

// retryLaterStatus returns the status error of an admission rejection
// with a RetryAfter, built once per prebuilt rejection: in full, with
// RetryInfo, since a client that reads it stays away for seconds to
// minutes, which saves far more than the compact form would.
func (s *Server) retryLaterStatus(oe *outcome.Error) error {
	if st, ok := s.retryLater.Load(oe); ok {
		return st.(error)
	}
	st := Status(oe).Err()
	if s.retryLaterCount.Add(1) <= maxRetryLater {
		s.retryLater.Store(oe, st)
	}
	return st
}

// DefaultMaxConcurrentStreams is the bound ServerOptions sets on the
// streams one connection may have open at once (grpc.MaxConcurrentStreams;
// grpc-go's own default is no bound): a client holding streams open
// without sending their messages holds at most this many per connection.
// A connection that carries R calls a second needs R times the round trip
// of a refusal: past the bound, calls wait for a stream on the client's
// side, where no admission sees them (docs/admission.md, "The stream
// bound").
const DefaultMaxConcurrentStreams = 1000

// ServerOptions returns the grpc.ServerOptions that install the tap handle,
// both interceptors and the stats handler, and bound each connection's
// concurrent streams to DefaultMaxConcurrentStreams (a
// grpc.MaxConcurrentStreams passed after them overrides it); pass them to
// grpc.NewServer. If the server needs its own tap handle, install
// TapHandle yourself (grpc allows one) and call it from yours, add the
// interceptors with grpc.ChainUnaryInterceptor and
// grpc.ChainStreamInterceptor, and the stats handler with
// grpc.StatsHandler.
func (s *Server) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InTapHandle(s.TapHandle()),
		grpc.ChainUnaryInterceptor(s.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(s.StreamInterceptor()),
		grpc.StatsHandler(s.StatsHandler()),
		grpc.MaxConcurrentStreams(DefaultMaxConcurrentStreams),
	}
}

// StatsHandler returns the stats handler that follows each connection
// (one intake.Conn each, in the connection's context) and its streams
// from the tap handle to their goroutines, for the connection policy
// under admission control (intake.Conn):
//
//   - When a stream gets its goroutine (TagRPC, which grpc-go calls first
//     thing on it), it leaves the pending count (intake.Handle.Scheduled):
//     from then on a stream whose message has not arrived waits on its
//     client and takes no room from the requests that can run. Without
//     the handler, such a stream holds room until its message comes or
//     it has been pending four target delays (admission.WithTargetDelay).
//   - A stream that arrives while WithConnShare (8) others of its
//     connection wait for their goroutines is over the connection's share
//     and gets only the first half of the task's room.
//   - A connection one of whose streams was refused as late (its message
//     came past admission's message timeout) has its next streams, health
//     checks aside, refused in the tap for its slow-sender penalty, then
//     is on probation. The tap is the connection's reader: while it waits
//     out intake.SlowSenderPace between two such refusals, nothing more
//     is read from that connection, its health checks included (grpc-go
//     calls the tap under the connection's transport lock, so the wait is
//     short).
//   - It bounds the requests of one connection that may be stalled at
//     once, waiting on their client without a slot (WithMaxConnStalls).
//
// With WithConnLoad, it also reports the connections, their calls and
// the health checks to a connload.Listener.
func (s *Server) StatsHandler() stats.Handler { return s.stats }

// WithConnLoad makes the stats handler report the server's connections to
// l (connload.Listener.Track): serve l itself, and pass the option, so
// that gRPC-Go gets bare connections, which it reads without pinning a
// buffer per idle connection, while l still counts them and bounds them.
// It also reports each connection's calls (which tell busy connections
// from idle ones) and each health check answered (a
// grpc.health.v1.Health Check, or a Watch opened; a Watch stream is not a
// call). Default: none.
//
//	cl, _ := connload.NewListener(lis)
//	ts, _ := triagegrpc.NewServer(triagegrpc.WithConnLoad(cl))
//	srv := grpc.NewServer(ts.ServerOptions()...)
//	srv.Serve(cl)
func WithConnLoad(l *connload.Listener) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.connLoad = l })
}

// streamStats is StatsHandler's handler. Each connection's context holds
// its connState.
type streamStats struct {
	load    *connload.Listener // nil without WithConnLoad
	tracker *connload.Tracker
}

// connState is what a Server keeps of one connection: the intake's, and
// connection load's if it reports to a connload.Listener.
type connState struct {
	in   *intake.Conn
	load *connload.Conn // set at ConnBegin
}

type (
	connStateKey struct{}
	watchKey     struct{}
)

// connOf returns the state of ctx's connection, or nil without the stats
// handler.
func connOf(ctx context.Context) *connState {
	c, _ := ctx.Value(connStateKey{}).(*connState)
	return c
}

func (h *streamStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connStateKey{}, &connState{in: new(intake.Conn)})
}

func (h *streamStats) HandleConn(ctx context.Context, s stats.ConnStats) {
	c := connOf(ctx)
	if h.tracker == nil || c == nil {
		return
	}
	switch s.(type) {
	case *stats.ConnBegin:
		c.load = h.tracker.Open()
	case *stats.ConnEnd:
		if c.load != nil {
			c.load.Close()
		}
	}
}

// SlowSenderRefusals returns how many streams the tap has refused as a
// slow sender's (intake.Intake.SlowSenderRefusals). They are refused
// before they are classified, so admission control's observer does not
// see them; export this (triageprom.SlowSenders) to see an attack.
func (s *Server) SlowSenderRefusals() uint64 { return s.in.SlowSenderRefusals() }

// TagRPC runs on the stream's goroutine. A Handle in ctx means the tap
// handle accepted the stream: grpc-go calls TagRPC for every stream the
// tap accepted that it does not drop first, and the tap refuses the ones
// it would drop (a malformed method name, a context already done). A
// stream to a method the server does not have gets no End event (unless
// the server has an unknown-service handler), and nothing says so here;
// the context of every stream ends, so a stream holding more than its
// admission ticket (intake.Handle.Holds: a pessimistic quota reservation,
// a decay's timer, a place on its connection's probation) is abandoned
// then too (context.AfterFunc: its cost, about half a microsecond, is
// paid only by those). With WithConnLoad, health checks are counted, and
// a health watch is marked so that it does not count as a call.
func (h *streamStats) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if hd := intake.HandleOf(ctx); hd != nil {
		hd.Scheduled()
		if hd.Holds() {
			context.AfterFunc(ctx, hd.Abandon)
		}
	}
	if h.load != nil && isHealthCheck(info.FullMethodName) {
		h.load.HealthCheck()
		if info.FullMethodName == healthWatch {
			return context.WithValue(ctx, watchKey{}, true)
		}
	}
	return ctx
}

// HandleRPC tells the request's Handle when its first message arrives
// (intake.Handle.MessageArrived: was its sender late?) and abandons the
// request at its end (a handler that never started: a message grpc-go
// could not decode, a compressor it lacks). With WithConnLoad, it counts
// a call from its Begin to its End, which grpc-go sends in pairs; a
// stream to an unknown method gets neither, so it never counts as a call
// in flight.
func (h *streamStats) HandleRPC(ctx context.Context, st stats.RPCStats) {
	switch st.(type) {
	case *stats.InPayload:
		if hd := intake.HandleOf(ctx); hd != nil {
			hd.MessageArrived()
		}
	case *stats.Begin:
		h.call(ctx, 1)
	case *stats.End:
		if hd := intake.HandleOf(ctx); hd != nil {
			hd.Abandon()
		}
		h.call(ctx, -1)
	}
}

// call counts a call beginning (1) or ending (-1) on its connection for
// connection load.
func (h *streamStats) call(ctx context.Context, d int) {
	if h.tracker == nil || ctx.Value(watchKey{}) != nil {
		return
	}
	if c := connOf(ctx); c != nil && c.load != nil {
		if d > 0 {
			c.load.CallBegin()
		} else {
			c.load.CallEnd()
		}
	}
}

// TapHandle returns the handle that runs each request through the intake
// as it arrives, before grpc creates a goroutine for it, reading the raw
// header metadata in place (an untrusted peer's triage keys are deleted
// there, so handlers never see them). A refusal is a prebuilt status: no
// goroutine, no message read.
func (s *Server) TapHandle() tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if !wellFormed(info.FullMethodName) {
			return nil, errMalformedMethod // grpc-go would drop it after the tap
		}
		c, err := s.accept(ctx, info.Header, info.FullMethodName)
		if err == nil && c.Err() != nil {
			// Its deadline has passed already (grpc-timeout 0): grpc-go
			// drops it after the tap, so it is not counted.
			intake.HandleOf(c).Abandon()
			return nil, errExpired
		}
		return c, err
	}
}

// The tap's answers to the streams grpc-go would drop after it.
var (
	errMalformedMethod = status.Error(codes.Unimplemented, "triage: malformed method name")
	errExpired         = status.Error(codes.DeadlineExceeded, context.DeadlineExceeded.Error())
)

// wellFormed reports whether grpc-go would route fullMethod to a handler:
// "/service/method", as grpc-go's server parses it.
func wellFormed(fullMethod string) bool {
	sm, ok := strings.CutPrefix(fullMethod, "/")
	return ok && strings.Contains(sm, "/")
}

// UnaryInterceptor returns the unary server interceptor. It runs the
// request through the intake if TapHandle did not (a slower path that
// copies the metadata), takes the execution slot, and maps the handler's
// error for the wire: overload outcomes become gRPC statuses, and outcomes
// received from downstream go up as "overloaded; don't retry"
// (outcome.Upward).
func (s *Server) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, h, err := s.ensure(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		h.TraceIn(ctx)
		if err := h.Start(); err != nil {
			if md := pushback(err); md != nil {
				grpc.SetTrailer(ctx, md)
			}
			return nil, s.rejection(err)
		}
		ran := false
		defer s.finishPanicked(h, &ran)
		resp, err := handler(ctx, req)
		ran = true
		h.Finish()
		if s.trailers != nil {
			s.trailers.finish(ctx, err)
		}
		err = outcome.Upward(err)
		if md := pushback(err); md != nil {
			grpc.SetTrailer(ctx, md)
		}
		return resp, ToError(err)
	}
}

// StreamInterceptor returns the streaming server interceptor, which does for
// streams what UnaryInterceptor does for unary calls. Under admission
// control the handler's SendMsg and RecvMsg wait on the client
// (intake.Handle.ClientWait): a handler blocked for the target delay on a
// client that does not read its responses (grpc's flow control) or send
// its next message gives its execution slot and its room back until the
// wait ends (admission.Controller.Stall).
func (s *Server) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		c, h, err := s.ensure(ctx, info.FullMethod)
		if err != nil {
			return err
		}
		h.TraceIn(c)
		if err := h.Start(); err != nil {
			if md := pushback(err); md != nil {
				ss.SetTrailer(md)
			}
			return s.rejection(err)
		}
		if c != ctx || h.UnderAdmission() {
			ss = &serverStream{ServerStream: ss, ctx: c, h: h, owner: goid.Get()}
		}
		ran := false
		defer s.finishPanicked(h, &ran)
		err = handler(srv, ss)
		ran = true
		h.Finish()
		if s.trailers != nil {
			s.trailers.finishStream(ss, err)
		}
		err = outcome.Upward(err)
		if md := pushback(err); md != nil {
			ss.SetTrailer(md)
		}
		return ToError(err)
	}
}

// finishPanicked finishes the request of a handler that did not return
// (ran is false: it panicked, and a recovery interceptor outside
// triage's may keep the server running), so that a panic holds no
// execution slot, quota reservation or decay timer, and counts as a
// failure in the load report. The panic goes on up.
func (s *Server) finishPanicked(h *intake.Handle, ran *bool) {
	if *ran {
		return
	}
	h.Finish()
	if s.trailers != nil && s.trailers.meter != nil {
		s.trailers.meter.Record(true)
	}
}

// serverStream is the handler's stream: its context is the request's,
// and its sends and receives wait on the client (intake.Handle.ClientWait),
// so that a handler blocked on a client that does not read its responses
// or send its next message gives its execution slot back. grpc-go allows
// a send and a receive on two goroutines at once: each wait names its
// goroutine, so that a goroutine reading the client while the handler's
// own computes does not free the slot.
type serverStream struct {
	grpc.ServerStream
	ctx   context.Context
	h     *intake.Handle
	owner int64 // the handler's goroutine
}

func (s *serverStream) Context() context.Context { return s.ctx }

func (s *serverStream) SendMsg(m any) error {
	g := waiter(s.owner)
	s.h.ClientWait(g)
	err := s.ServerStream.SendMsg(m)
	s.h.ClientResume(g)
	return err
}

func (s *serverStream) RecvMsg(m any) error {
	g := waiter(s.owner)
	s.h.ClientWait(g)
	err := s.ServerStream.RecvMsg(m)
	s.h.ClientResume(g)
	return err
}

// waiter names the calling goroutine for intake.Handle.ClientWait:
// intake.Own on the handler's own goroutine (owner), else its id.
func waiter(owner int64) uint64 {
	if g := goid.Get(); g != owner {
		return uint64(g)
	}
	return intake.Own
}

// ensure returns the request's Handle, running the request through the
// intake unless the tap handle already did.
func (s *Server) ensure(ctx context.Context, fullMethod string) (context.Context, *intake.Handle, error) {
	if h := intake.HandleOf(ctx); h != nil {
		return ctx, h, nil
	}
	md, _ := metadata.FromIncomingContext(ctx) // a copy: the cleaned copy is installed
	c, err := s.accept(ctx, md, fullMethod)
	if err != nil {
		return nil, nil, err
	}
	c = metadata.NewIncomingContext(c, md)
	return c, intake.HandleOf(c), nil
}

// Health checks are answered whatever the load, outside admission, quotas
// and isolation (intake.Request.HealthCheck): the health service's own
// methods, nothing else under its name.
var healthMethods = [...]string{"/grpc.health.v1.Health/Check", healthWatch, "/grpc.health.v1.Health/List"}

// healthWatch is the health service's streaming method, which lasts as
// long as its connection.
const healthWatch = "/grpc.health.v1.Health/Watch"

func isHealthCheck(fullMethod string) bool {
	for _, m := range healthMethods {
		if fullMethod == m {
			return true
		}
	}
	return false
}

// accept translates the request for the intake and its refusal for the
// wire.
func (s *Server) accept(ctx context.Context, md metadata.MD, fullMethod string) (context.Context, error) {
	r := intake.Request{
		Peer:        PeerOf(ctx),
		Host:        single(md, ":authority"),
		Path:        fullMethod,
		Header:      md,
		Case:        intake.LowerCase,
		HealthCheck: isHealthCheck(fullMethod),
	}
	if c := connOf(ctx); c != nil {
		r.Conn = c.in
	}
	if s.group != nil && s.in.NeedsGroup() {
		r.Group = s.group(ctx, md)
	}
	h, err := s.in.Accept(ctx, &r)
	if err != nil {
		return nil, s.rejection(err)
	}
	return h, nil
}

// single returns the only value of key in md; a missing or repeated key
// gives "".
func single(md metadata.MD, key string) string {
	v := md[key]
	if len(v) != 1 {
		return ""
	}
	return v[0]
}
