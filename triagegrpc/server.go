package triagegrpc

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/internal/reqctx"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/trust"
	"github.com/triagehq/triage/wire"
)

// Server holds the server side of the adapter: who is trusted and how
// criticality is assigned. Its interceptors are safe for concurrent use and
// keep no per-request state beyond the request's own context.
type Server struct {
	trust      *trust.Policy
	classifier *edge.Classifier
	admission  *admission.Controller
	trailers   *trailers // nil without load reports and lifecycle
	customerID bool      // the peer's mTLS identity names the customer
	quota      *quota.Enforcer
	meter      *cost.Meter
	outOfQuota error
	blackHole  error
	clock      clock.Clock
	iso        *isolate.Table
	// rejections holds the status error of every admission rejection,
	// built once in compact form (see compactStatus), so that rejecting
	// allocates nothing in triage and as little as possible in grpc-go.
	rejections [admission.NumReasons][2]error
}

// ServerOption configures a Server.
type ServerOption interface{ applyServer(*serverConfig) }

type serverConfig struct {
	trust      *trust.Policy
	classifier *edge.Classifier
	admission  *admission.Controller
	meter      *balance.Meter
	lifecycle  *Lifecycle
	clock      clock.Clock
	customerID bool
	quota      *quota.Enforcer
	cost       *cost.Meter
	iso        *isolate.Table
}

type serverOptionFunc func(*serverConfig)

func (f serverOptionFunc) applyServer(c *serverConfig) { f(c) }

// WithTrust sets the peers whose triage metadata is believed. Default: none
// (every peer is untrusted, and criticality comes from the classifier's
// other rules or its default).
func WithTrust(p *trust.Policy) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.trust = p })
}

// WithClassifier sets the rules that assign criticality. Default:
// edge.HeaderOnly(), which believes a trusted peer's header and otherwise
// assigns CRITICAL. An edge gRPC service uses host (:authority) and path
// (full method) rules here.
func WithClassifier(c *edge.Classifier) ServerOption {
	return serverOptionFunc(func(sc *serverConfig) { sc.classifier = c })
}

// WithAdmission installs admission control: the tap handle asks the
// Controller at stream arrival, before a handler goroutine exists, and
// rejects there; the interceptors take an execution slot before the
// handler and give it back after. Default: none.
func WithAdmission(c *admission.Controller) ServerOption {
	return serverOptionFunc(func(sc *serverConfig) { sc.admission = c })
}

// WithLoadReports makes every response carry the task's load report from
// m (queries and errors per second, utilization) in ORCA's per-call format,
// the endpoint-load-metrics-bin trailer, for weighted round robin in
// triage's balancer or grpc-go's weighted_round_robin. The interceptors
// record each call's outcome in m. The report is rebuilt every 100 ms.
// Default: none.
func WithLoadReports(m *balance.Meter) ServerOption {
	return serverOptionFunc(func(sc *serverConfig) { sc.meter = m })
}

// WithLifecycle makes every response carry triage-lame-duck: 1 while l is
// in lame duck. Default: none.
func WithLifecycle(l *Lifecycle) ServerOption {
	return serverOptionFunc(func(sc *serverConfig) { sc.lifecycle = l })
}

// WithServerIsolation names each request's client type from its :authority
// (isolate.Table.ClientFor) and puts it in the handler's context
// (isolate.ClientOf), so that the calls the handler makes are routed by
// it (triagegrpc.WithBalancerIsolation); a client type the table
// black-holes is refused in the tap, "overloaded; don't retry", before a
// handler goroutine exists. Default: none.
func WithServerIsolation(t *isolate.Table) ServerOption {
	return serverOptionFunc(func(sc *serverConfig) { sc.iso = t })
}

// WithCustomerFromIdentity makes the peer's verified mTLS identity (its
// first URI SAN, else DNS SAN) the customer of requests that do not carry
// a trusted triage-customer: a client service authenticated by its
// certificate spends its own quota. Default: only a trusted peer's
// triage-customer names a customer; others are "" (the default limit).
func WithCustomerFromIdentity() ServerOption {
	return serverOptionFunc(func(sc *serverConfig) { sc.customerID = true })
}

// WithQuota installs per-customer quotas: the tap handle asks e whether
// the request's customer is within its quota (quota.Enforcer.Admit) before
// admission control, and refuses it there with RESOURCE_EXHAUSTED, out of
// quota, retry after 1 s; the interceptors measure each request's CPU with
// m (package cost) and charge it to its customer in e's Usage. Outgoing
// calls made through a triage Client from the handler's context are marked
// as waits, not charged. Default: none.
func WithQuota(e *quota.Enforcer, m *cost.Meter) ServerOption {
	return serverOptionFunc(func(sc *serverConfig) { sc.quota, sc.cost = e, m })
}

// WithServerClock sets the clock of the Server's own timing (how often the
// load report trailer is rebuilt, when a criticality decay starts or
// falls due). Default clock.Real().
func WithServerClock(c clock.Clock) ServerOption {
	return serverOptionFunc(func(sc *serverConfig) { sc.clock = c })
}

// NewServer returns a Server.
func NewServer(opts ...ServerOption) (*Server, error) {
	var c serverConfig
	for _, o := range opts {
		o.applyServer(&c)
	}
	if c.classifier == nil {
		cl, err := edge.New(edge.HeaderOnly())
		if err != nil {
			return nil, fmt.Errorf("triagegrpc: %w", err)
		}
		c.classifier = cl
	}
	s := &Server{trust: c.trust, classifier: c.classifier, admission: c.admission, customerID: c.customerID, iso: c.iso}
	if (c.quota == nil) != (c.cost == nil) {
		return nil, fmt.Errorf("triagegrpc: WithQuota needs both an Enforcer and a cost Meter")
	}
	if c.quota != nil {
		s.quota, s.meter = c.quota, c.cost
		s.outOfQuota = compactStatus(&outcome.Error{Kind: outcome.OutOfQuota, Reason: "customer over quota", RetryAfter: time.Second}).Err()
	}
	clk := clock.OrReal(c.clock)
	s.clock = clk
	s.blackHole = errBlackHole
	if t := (&trailers{meter: c.meter, lifecycle: c.lifecycle, since: clock.SinceFunc(clk, clk.Now())}); t.enabled() {
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
		i := 0
		if dr {
			i = 1
		}
		return s.rejections[r][i]
	}
	return ToError(err)
}

// ServerOptions returns the grpc.ServerOptions that install the tap handle
// and both interceptors; pass them to grpc.NewServer. If the server needs
// its own tap handle, install TapHandle yourself (grpc allows one) and call
// it from yours, and add the interceptors with grpc.ChainUnaryInterceptor
// and grpc.ChainStreamInterceptor.
func (s *Server) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InTapHandle(s.TapHandle()),
		grpc.ChainUnaryInterceptor(s.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(s.StreamInterceptor()),
	}
}

// TapHandle returns the handle that classifies a request as it arrives,
// before grpc creates a goroutine for it: it decides whether the peer is
// trusted, reads criticality and attempt from the raw header metadata
// (without copying it), deletes every triage key an untrusted peer sent (so
// handlers never see them), and puts criticality and attempt in the
// stream's context, in one allocation (a context node carrying both).
//
// With admission control, the tap handle also asks the Controller whether
// the request may enter (admission.Controller.Arrive) and rejects it there,
// which is the cheapest place: no goroutine, no message read.
func (s *Server) TapHandle() tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		return s.classify(ctx, info.Header, info.FullMethodName, true)
	}
}

// UnaryInterceptor returns the unary server interceptor. It classifies the
// request if TapHandle did not (a slower path that copies the metadata), and
// maps the handler's error for the wire: overload outcomes become gRPC
// statuses, and outcomes received from downstream go up as "overloaded;
// don't retry" (outcome.Upward).
func (s *Server) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := s.ensure(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		n := admittedOf(ctx)
		if n != nil {
			if err := n.start(ctx); err != nil {
				return nil, s.rejection(err)
			}
		}
		resp, err := handler(ctx, req)
		if n != nil {
			n.finish()
		}
		if s.trailers != nil {
			s.trailers.finish(ctx, err)
		}
		return resp, ToError(outcome.Upward(err))
	}
}

// StreamInterceptor returns the streaming server interceptor, which does for
// streams what UnaryInterceptor does for unary calls.
func (s *Server) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		c, err := s.ensure(ctx, info.FullMethod)
		if err != nil {
			return err
		}
		if c != ctx {
			ss = &serverStream{ServerStream: ss, ctx: c}
		}
		n := admittedOf(c)
		if n != nil {
			if err := n.start(c); err != nil {
				return s.rejection(err)
			}
			defer n.finish()
		}
		err = handler(srv, ss)
		if s.trailers != nil {
			s.trailers.finishStream(ss, err)
		}
		return ToError(outcome.Upward(err))
	}
}

type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }

// ensure classifies (and admits) the request unless the tap handle already
// did.
func (s *Server) ensure(ctx context.Context, fullMethod string) (context.Context, error) {
	if _, done := criticality.FromContext(ctx); done {
		return ctx, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	return s.classify(ctx, md, fullMethod, false)
}

// single returns the only value of key in md; a missing or repeated key
// gives "" (a repeated triage key is malformed and is ignored).
func single(md metadata.MD, key string) string {
	v := md[key]
	if len(v) != 1 {
		return ""
	}
	return v[0]
}

// classify assigns criticality and attempt and returns the handler's
// context. raw says md is the transport's own map (the tap), which may be
// edited in place; otherwise it is a copy and a cleaned copy is installed.
func (s *Server) classify(ctx context.Context, md metadata.MD, fullMethod string, raw bool) (context.Context, error) {
	p := PeerOf(ctx)
	trusted := s.trust.Trusted(p)
	req := edge.Request{
		Trusted: trusted,
		Host:    single(md, ":authority"),
		Path:    fullMethod,
	}
	n, customer, decayWire := 0, "", ""
	if trusted {
		req.Header = single(md, wire.CriticalityKey)
		decayWire = single(md, wire.DecayKey)
		if v := single(md, wire.AttemptKey); v != "" {
			n, _ = attempt.Parse(v)
		}
		if v := single(md, wire.CustomerKey); len(v) <= wire.CustomerMaxLen {
			customer = quota.Customer(v)
		}
	} else if strip(md, s.classifier.Observer()) && !raw {
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	if customer == "" && s.customerID && len(p.Identities) > 0 {
		customer = quota.Customer(p.Identities[0])
	}
	d := s.classifier.Classify(&req)
	if strings.HasPrefix(fullMethod, healthService) {
		// Health checks are answered whatever the load, outside admission,
		// quotas and isolation: they are how a client learns that a task
		// is in lame duck, and a Watch stream lasts as long as its
		// connection, so counted as executing it would hold a slot forever.
		return reqctx.WithRequest(ctx, uint8(d.Level), uint8(n), customer), nil
	}
	if s.iso != nil {
		if ct := s.iso.ClientFor(req.Host); ct != "" {
			if s.iso.RouteOf(ct) == isolate.BlackHole {
				return nil, s.blackHole
			}
			ctx = isolate.NewContext(ctx, ct)
		}
	}
	switch {
	case d.Decay.After > 0: // a rule's decay starts now; on gRPC, cancel falls to SHEDDABLE
		ctx = criticality.WithDecay(ctx, criticality.Decay{At: s.clock.Now().Add(d.Decay.After), To: d.Decay.To})
	case decayWire != "" && d.Rule == edge.Header:
		now := s.clock.Now()
		if dc, err := criticality.ParseDecay(decayWire, now); err == nil {
			ctx = criticality.WithDecay(ctx, dc)
			d.Level, _ = criticality.Current(ctx, now)
		}
	}
	var res quota.Reservation
	if s.quota != nil {
		var err error
		if res, err = s.quota.Reserve(customer, d.Level); err != nil {
			return nil, s.outOfQuota
		}
	}
	if s.admission == nil && s.quota == nil {
		return reqctx.WithRequest(ctx, uint8(d.Level), uint8(n), customer), nil
	}
	return s.admit(ctx, d.Level, n, customer, res)
}

// strip deletes every triage key from md, reporting each to obs, and says
// whether it deleted any.
func strip(md metadata.MD, obs edge.Observer) bool {
	found := false
	for k := range md {
		if !wire.IsTriage(k) {
			continue
		}
		found = true
		if key, ok := wire.Lookup(k); ok {
			obs.Stripped(key.Name)
		} else {
			obs.Stripped("unregistered")
		}
		delete(md, k)
	}
	return found
}
