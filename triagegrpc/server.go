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
	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/trust"
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
	connShare       int32 // 0: no share by connection
	maxConnStalls   int
	penaliseTrusted bool
	stats           *streamStats
	clock           clock.Clock
	since           func() time.Duration
	slowRefused     atomic.Uint64 // streams the tap refused as a slow sender's
}

// ServerOption configures a Server.
type ServerOption interface{ applyServer(*serverConfig) }

type serverConfig struct {
	intake          []intake.Option
	meter           *balance.Meter
	lifecycle       *lifecycle.Lifecycle
	clock           clock.Clock
	group           func(context.Context, metadata.MD) string
	connShare       int32
	maxConnStalls   int
	penaliseTrusted bool
}

type serverOptionFunc func(*serverConfig)

func (f serverOptionFunc) applyServer(c *serverConfig) { f(c) }

func withIntake(o intake.Option) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.intake = append(c.intake, o) })
}

// WithTrust sets the peers whose triage metadata is believed
// (intake.WithTrust). Default: none.
func WithTrust(p *trust.Policy) ServerOption { return withIntake(intake.WithTrust(p)) }

// WithClassifier sets the rules that assign criticality
// (intake.WithClassifier). Default: edge.HeaderOnly(). An edge gRPC
// service uses host (:authority) and path (full method) rules here.
func WithClassifier(c *edge.Classifier) ServerOption { return withIntake(intake.WithClassifier(c)) }

// WithGroup supplies the user group for the classifier's group rules,
// from the stream's context (its peer) and its header metadata. It is
// called only when the classifier has a group rule. Default: no group.
func WithGroup(f func(ctx context.Context, md metadata.MD) string) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.group = f })
}

// WithAdmission installs admission control (intake.WithAdmission): the
// tap handle asks the Controller at stream arrival, before a handler
// goroutine exists, and rejects there; the interceptors take an execution
// slot before the handler and give it back after. Default: none.
func WithAdmission(c *admission.Controller) ServerOption { return withIntake(intake.WithAdmission(c)) }

// WithLoadReports makes every response carry the task's load report from
// m (queries and errors per second, utilization) in ORCA's per-call format,
// the endpoint-load-metrics-bin trailer, for weighted round robin in
// triage's balancer or grpc-go's weighted_round_robin. The interceptors
// record each call's outcome in m. Default: none.
func WithLoadReports(m *balance.Meter) ServerOption {
	return serverOptionFunc(func(sc *serverConfig) { sc.meter = m })
}

// WithLifecycle makes every response carry triage-lame-duck: 1 while l is
// in lame duck. Default: none.
func WithLifecycle(l *lifecycle.Lifecycle) ServerOption {
	return serverOptionFunc(func(sc *serverConfig) { sc.lifecycle = l })
}

// WithServerIsolation names each request's client type from its
// :authority and refuses black-holed ones in the tap, "overloaded; don't
// retry" (intake.WithIsolation); the handler's outgoing calls are routed
// by it (lb.WithIsolation). Default: none.
func WithServerIsolation(t *isolate.Table) ServerOption { return withIntake(intake.WithIsolation(t)) }

// WithCustomerFromIdentity makes the peer's verified mTLS identity the
// customer of requests without a trusted triage-customer
// (intake.WithCustomerFromIdentity). Default: off.
func WithCustomerFromIdentity() ServerOption { return withIntake(intake.WithCustomerFromIdentity()) }

// WithQuota installs per-customer quotas (intake.WithQuota): the tap
// refuses a customer over its quota with RESOURCE_EXHAUSTED, out of quota,
// retry after 1 s; the handler's CPU, measured with m, is charged to its
// customer. Outgoing calls made through a triage Client from the
// handler's context are marked as waits, not charged. Default: none.
func WithQuota(e *quota.Enforcer, m *cost.Meter) ServerOption {
	return withIntake(intake.WithQuota(e, m))
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
	c := serverConfig{connShare: DefaultConnShare, maxConnStalls: intake.DefaultMaxConnStalls}
	for _, o := range opts {
		o.applyServer(&c)
	}
	in, err := intake.New(c.intake...)
	if err != nil {
		return nil, fmt.Errorf("triagegrpc: %w", err)
	}
	clk := clock.OrReal(c.clock)
	s := &Server{in: in, group: c.group, connShare: c.connShare, maxConnStalls: c.maxConnStalls, penaliseTrusted: c.penaliseTrusted,
		clock: clk, since: clock.SinceFunc(clk, clk.Now()),
		blackHole: compactStatus(intake.ErrBlackHoled).Err()}
	s.outOfQuota = compactStatus(&outcome.Error{Kind: outcome.OutOfQuota, Reason: "customer over quota", RetryAfter: time.Second}).Err()
	s.stats = &streamStats{maxStalls: c.maxConnStalls}
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
	if err == intake.ErrBlackHoled {
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
// grpc-go's own default is no bound, net/http's HTTP/2 server's is this):
// a client holding streams open without sending their messages holds at
// most this many per connection.
const DefaultMaxConcurrentStreams = 250

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

// StatsHandler returns the stats handler that follows each connection's
// streams from the tap handle to their goroutines, which admission control
// needs for two things:
//
//   - When a stream gets its goroutine (TagRPC, which grpc-go calls first
//     thing on it), it leaves the pending count (intake.Handle.Scheduled):
//     from then on a stream whose message has not arrived waits on its
//     client and takes no room from the requests that can run. Without
//     the handler, such a stream holds room until its message comes or
//     it has been pending four target delays (admission.WithTargetDelay).
//   - A stream that arrives while WithConnShare (8) others of its connection
//     wait for their goroutines is over the connection's share
//     (intake.Request.OverShare), and gets only the first half of the
//     task's room, so that one connection's burst does not lock the
//     others out.
//
// With it, a connection one of whose streams the interceptors refused as
// late (its message came past admission's message timeout) has its next
// streams, health checks aside, refused in the tap for
// DefaultSlowSenderPenalty (1 s, doubling to MaxSlowSenderPenalty while it
// offends again): a slow sender's burst of late messages costs a
// goroutine and a refusal per stream, which the tap's refusal does not.
// After its penalty the connection is on probation for
// MaxSlowSenderPenalty: it may hold at most WithConnShare streams whose
// message has not come, and its next is refused in the tap too, so that
// its next burst of late messages is a few streams. The tap refuses such
// a connection's streams at most one per SlowSenderPace (1 ms),
// holding its reader in between: the connection is not read while it
// waits, so a slow sender's burst of new streams is spread out rather
// than served ahead of other connections' requests, and however fast it
// opens them it costs the task at most one refusal per pace.
//
// It keeps a few words per connection, in the connection's context: a
// connection's state lives and dies with it.
//
// It also bounds the requests of one connection that may be stalled at
// once, waiting on their client without a slot (WithMaxConnStalls).
func (s *Server) StatsHandler() stats.Handler { return s.stats }

// WithMaxConnStalls bounds the requests of one connection that may be
// stalled at once (intake.ConnStalls): a handler waiting on its client
// past that keeps its execution slot. Default intake.DefaultMaxConnStalls.
func WithMaxConnStalls(n int) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.maxConnStalls = min(max(n, 0), 1<<30) })
}

// DefaultSlowSenderPenalty is how long a connection whose stream sent its
// message past the message timeout has its next streams refused at
// arrival; it doubles while the connection
// offends again within MaxSlowSenderPenalty of its last penalty's end.
const DefaultSlowSenderPenalty = time.Second

// MaxSlowSenderPenalty bounds the doubling of a connection's slow-sender
// penalty.
const MaxSlowSenderPenalty = time.Minute

// SlowSenderPace is how often, at most, the tap refuses a stream of a
// connection serving a slow-sender penalty or over its share on
// probation. Between two refusals the connection's reader waits: nothing
// more is read from that connection, its health checks included, until
// the next refusal is due. grpc-go calls the tap under the connection's
// transport lock, which the wait holds, so it is short.
const SlowSenderPace = time.Millisecond

// DefaultConnShare is how many of a connection's streams may wait for
// their goroutines before its next stream is over the connection's share
// of the task (StatsHandler, WithConnShare).
const DefaultConnShare = 8

// WithTrustedSlowSenderPenalty penalises slow senders among trusted
// peers too (WithTrust). By default a trusted peer's connection is never
// penalised: it is typically a proxy multiplexing many callers, and one
// slow caller would penalise them all; the late message itself is still
// refused.
func WithTrustedSlowSenderPenalty() ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.penaliseTrusted = true })
}

// WithConnShare sets how many of a connection's streams may wait for their
// goroutines before its next stream is over the connection's share of the
// task and gets only half of its room (StatsHandler), and how many streams
// without their message a slow sender's connection may hold on probation;
// 0 turns both off. Default DefaultConnShare.
func WithConnShare(n int) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.connShare = int32(min(max(n, 0), 1<<30)) })
}

// streamStats is StatsHandler's handler. Each connection's context holds
// its connState.
type streamStats struct {
	maxStalls int
}

// connState is what a Server keeps of one connection: the count of its
// streams the tap handle accepted whose goroutine has not run yet, and its
// slow-sender penalty.
type connState struct {
	waiting atomic.Int32
	// probation counts the streams admitted while the connection was on
	// probation whose message has not come and which have not ended.
	probation atomic.Int32
	// slowUntil is when the penalty ends, on the Server's clock (since its
	// start, ns); 0: never penalised.
	slowUntil atomic.Int64
	// paceNext is when the tap may refuse the connection's next stream as
	// a slow sender's, on the Server's clock (since its start, ns).
	paceNext atomic.Int64
	mu       sync.Mutex    // orders penalties
	penalty  time.Duration // the last one given
	stalls   *intake.ConnStalls
}

type connStateKey struct{}

// connOf returns the state of ctx's connection, or nil without the stats
// handler.
func connOf(ctx context.Context) *connState {
	c, _ := ctx.Value(connStateKey{}).(*connState)
	return c
}

func (h *streamStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connStateKey{}, &connState{stalls: intake.NewConnStalls(h.maxStalls)})
}

// slow reports whether the connection is serving a slow-sender penalty,
// and whether it is on probation after one (until MaxSlowSenderPenalty
// past its end).
func (s *Server) slow(c *connState) (penalty, probation bool) {
	u := c.slowUntil.Load()
	if u == 0 {
		return false, false
	}
	now := int64(s.since())
	return now < u, now < u+int64(MaxSlowSenderPenalty)
}

// pace waits, on the tap's goroutine (the connection's reader), until the
// connection's next refusal as a slow sender is due, and books the one
// after it a pace later.
func (s *Server) pace(c *connState) {
	now := int64(s.since())
	var due int64
	for {
		next := c.paceNext.Load()
		due = max(next, now)
		if c.paceNext.CompareAndSwap(next, due+int64(SlowSenderPace)) {
			break
		}
	}
	if due > now {
		t := s.clock.NewTimer(time.Duration(due - now))
		<-t.C()
	}
}

// SlowSenderRefusals returns how many streams the tap has refused as a
// slow sender's (StatsHandler: in a connection's penalty, or over its
// share on probation). They are refused before they are classified, so
// admission control's observer does not see them; export this
// (triageprom.SlowSenders) to see an attack.
func (s *Server) SlowSenderRefusals() uint64 { return s.slowRefused.Load() }

// probeKey keys a stream admitted on probation in its context.
type probeKey struct{}

// probeMark is a stream admitted on probation: it leaves its connection's
// count once, at its first message or its end.
type probeMark struct {
	c    *connState
	left atomic.Bool
}

// noteLate penalises the connection of a request refused as late whose
// client sent the message past the message timeout: the message came
// that long after the request's goroutine was ready for it
// (intake.Handle.SenderLate), so the delay is the sender's, not the
// server's (its scheduler, GC, interceptors before triage's). A stream's
// handler starts before it reads any message, so a stream is never the
// sender's fault. A trusted peer (a proxy the operator trusts, whose
// connection carries many callers) is not penalised unless
// WithTrustedSlowSenderPenalty. One penalty per burst of late messages: a
// refusal during the penalty adds nothing.
func (s *Server) noteLate(ctx context.Context, h *intake.Handle, err error) {
	if !h.SenderLate() {
		return
	}
	if r, _, ok := admission.RejectionOf(err); !ok || r != admission.Late {
		return
	}
	if !s.penaliseTrusted && s.in.Trusted(PeerOf(ctx)) {
		return
	}
	c := connOf(ctx)
	if c == nil {
		return
	}
	now := int64(s.since())
	c.mu.Lock()
	defer c.mu.Unlock()
	until := c.slowUntil.Load()
	if now < until {
		return
	}
	p := DefaultSlowSenderPenalty
	if until != 0 && now < until+int64(MaxSlowSenderPenalty) {
		p = min(2*c.penalty, MaxSlowSenderPenalty)
	}
	c.penalty = p
	c.slowUntil.Store(now + int64(p))
}

// TagRPC runs on the stream's goroutine. A Handle in ctx means the tap
// handle accepted the stream, and counted it if the count was there:
// grpc-go calls TagRPC for every stream the tap accepted that it does not
// drop first, and the tap refuses the ones it would drop (a malformed
// method name, a context already done). A stream to a method the server
// does not have gets no End event (unless the server has an
// unknown-service handler), and nothing says so here; the context of
// every stream ends, so a stream holding more than its admission ticket
// (a pessimistic quota reservation, a decay's timer: intake.Handle.Holds)
// or admitted on probation is settled then too (context.AfterFunc: its
// cost, about half a microsecond, is paid only by those).
func (*streamStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	if h := intake.HandleOf(ctx); h != nil {
		h.Scheduled()
		if c := connOf(ctx); c != nil {
			c.waiting.Add(-1)
		}
		if h.Holds() || ctx.Value(probeKey{}) != nil {
			context.AfterFunc(ctx, func() { settle(ctx, h) })
		}
	}
	return ctx
}

// settle ends a stream's request for good, at its End event or its
// context's end: the request is abandoned unless its handler started
// (intake.Handle.Abandon), and a stream admitted on probation leaves its
// connection's count. It may run twice.
func settle(ctx context.Context, h *intake.Handle) {
	h.Abandon()
	leaveProbation(ctx)
}

// leaveProbation takes a stream admitted on probation out of its
// connection's count, once.
func leaveProbation(ctx context.Context) {
	if m, _ := ctx.Value(probeKey{}).(*probeMark); m != nil && m.left.CompareAndSwap(false, true) {
		m.c.probation.Add(-1)
	}
}

// HandleRPC tells the request's Handle when its first message arrives
// (intake.Handle.MessageArrived: was its sender late?), takes a stream
// admitted on probation out of its connection's count at its first
// message, and settles the request at its end (a handler that never
// started: a message grpc-go could not decode, a compressor it lacks).
func (*streamStats) HandleRPC(ctx context.Context, st stats.RPCStats) {
	switch st.(type) {
	case *stats.InPayload:
		if h := intake.HandleOf(ctx); h != nil {
			h.MessageArrived()
		}
		leaveProbation(ctx)
	case *stats.End:
		if h := intake.HandleOf(ctx); h != nil {
			settle(ctx, h)
		}
	}
}

func (*streamStats) HandleConn(context.Context, stats.ConnStats) {}

// TapHandle returns the handle that runs each request through the intake
// as it arrives, before grpc creates a goroutine for it, reading the raw
// header metadata in place (an untrusted peer's triage keys are deleted
// there, so handlers never see them). A refusal is a prebuilt status: no
// goroutine, no message read.
func (s *Server) TapHandle() tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		cs := connOf(ctx)
		var probation bool
		if cs != nil && !isHealthCheck(info.FullMethodName) {
			var penalty bool
			penalty, probation = s.slow(cs)
			probation = probation && s.connShare > 0
			if penalty || probation && cs.probation.Load() >= s.connShare {
				s.pace(cs)
				s.slowRefused.Add(1)
				return nil, s.rejections[admission.Late][0]
			}
		}
		if !wellFormed(info.FullMethodName) {
			return nil, errMalformedMethod // grpc-go would drop it after the tap
		}
		c, err := s.accept(ctx, info.Header, info.FullMethodName, cs != nil && s.connShare > 0 && cs.waiting.Load() >= s.connShare)
		if err == nil && c.Err() != nil {
			// Its deadline has passed already (grpc-timeout 0): grpc-go
			// drops it after the tap, so it is not counted.
			intake.HandleOf(c).Abandon()
			return nil, errExpired
		}
		if err == nil && cs != nil {
			cs.waiting.Add(1)
			if probation {
				cs.probation.Add(1)
				c = context.WithValue(c, probeKey{}, &probeMark{c: cs})
			}
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
		if err := h.Start(); err != nil {
			s.noteLate(ctx, h, err)
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
		return resp, ToError(outcome.Upward(err))
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
		if err := h.Start(); err != nil {
			s.noteLate(c, h, err)
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
		return ToError(outcome.Upward(err))
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
	c, err := s.accept(ctx, md, fullMethod, false)
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
func (s *Server) accept(ctx context.Context, md metadata.MD, fullMethod string, overShare bool) (context.Context, error) {
	r := intake.Request{
		OverShare:   overShare,
		Peer:        PeerOf(ctx),
		Host:        single(md, ":authority"),
		Path:        fullMethod,
		Header:      md,
		Case:        intake.LowerCase,
		HealthCheck: isHealthCheck(fullMethod),
	}
	if c := connOf(ctx); c != nil {
		r.ConnStalls = c.stalls
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
