// Package triageextproc is triage as an Envoy external processor: a gRPC
// server of envoy.service.ext_proc.v3.ExternalProcessor that an Envoy
// proxy consults on each HTTP request (its ext_proc HTTP filter), so that
// a mesh of services in any language gets triage's edge and admission
// control without linking it.
//
// For each request Envoy opens a stream and sends the request headers;
// the Server runs them through the same intake as the library's adapters
// (trust, edge rules, criticality, decay, customer, client type, quotas,
// admission), waiting for an execution slot if admission says so, and
// answers either
//
//   - continue, with the request's triage headers set (criticality, and
//     its decay, customer and attempt counter when it has them) and an
//     untrusted peer's triage headers removed; or
//   - an immediate response: 503 (task overloaded, overloaded; don't
//     retry) or 429 (out of quota) with Triage-Outcome and Retry-After,
//     and for a gRPC request the gRPC status triagegrpc gives the outcome.
//
// The request's execution slot is held until Envoy sends the response
// headers (processing_mode response_header_mode SEND, Envoy's default)
// or the stream ends (the request finished or was reset), so that
// admission measures the upstream's latency and counts what it is doing.
// Request and response bodies and trailers, if Envoy is configured to
// send them, are passed through unchanged.
//
// A caller's triage keys may come as claims (wire.ClaimPrefix), moved
// there by the header_mutation filter docs/envoy.md puts before this one,
// so that Envoy failing open forwards none of them as keys: the Server
// reads a claim as the key it names and removes it.
//
// The caller is the peer Envoy names in the request attribute
// source.address (and connection.uri_san_peer_certificate for its
// identity); configure the filter's request_attributes with them. A
// request without them comes from an unknown peer, whose triage headers
// are never believed. The Server trusts whoever can open a stream to it:
// serve it to Envoy only (loopback, or mTLS).
//
// A Server is safe for concurrent use; it keeps nothing per stream beyond
// the stream's own goroutine, and is bounded by its admission
// controller's queue; made with NewPerCluster, by MaxClusters controllers
// and their intakes as well. Docs: docs/envoy.md.
package triageextproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/grpcwire"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
	"github.com/triagehq/triage/wire"
)

// Attributes the Server reads from a request, when Envoy sends them
// (the ext_proc filter's request_attributes).
const (
	SourceAddressAttribute = "source.address"
	PeerURISANAttribute    = "connection.uri_san_peer_certificate"
	// ClusterAttribute names the upstream cluster Envoy routes the
	// request to: with NewPerCluster, each has its own admission
	// controller.
	ClusterAttribute = "xds.cluster_name"
)

// MaxClusters bounds the clusters a Server made with NewPerCluster keeps
// a controller for: requests to clusters past it share the default one.
const MaxClusters = 256

// MaxHeaders bounds the request headers the Server reads: a request with
// more is answered 431 (Request Header Fields Too Large) by the processor,
// not with an error on the stream, which Envoy's fail-open would pass on
// unprocessed.
const MaxHeaders = 256

// Server is the external processor. Make one with New and register it
// on a grpc.Server with Register.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	// DecisionTimeout bounds the time the processor takes to answer a
	// request's headers (0: DefaultDecisionTimeout). A request still
	// waiting for an execution slot then is refused as task overloaded:
	// Envoy's message_timeout, which must be above it, would otherwise
	// let the request through unprocessed (failure_mode_allow), triage
	// headers and all. Set it before Register.
	DecisionTimeout time.Duration
	// HealthChecks are the paths of health checks that pass through
	// Envoy (gRPC's "/grpc.health.v1.Health/Check", an HTTP probe path):
	// classified, and answered whatever the load, outside isolation,
	// quotas and admission, as triagehttp.WithHealthCheck does. Set it
	// before Register.
	HealthChecks []string
	// Group, if set, gives a request's user group for the edge's group
	// rules, from its headers (header returns a header's first value by
	// name), as triagehttp.WithGroup does. Set it before Register.
	Group func(header func(name string) string) string

	in       *intake.Intake // requests to no cluster, or past MaxClusters
	clusters *clusters      // NewPerCluster's; nil: in serves every request
	keys     *egress.Caller // what an admitted request carries on: egress.Call.Keys
}

// clusters is the intake of each upstream cluster (NewPerCluster): its
// own admission controller, the Server's other options.
type clusters struct {
	opts  []intake.Option
	admit func(cluster string) (*admission.Controller, error)
	mu    sync.RWMutex
	by    map[string]*intake.Intake // at most MaxClusters
}

// DefaultDecisionTimeout is the decision bound without DecisionTimeout:
// batchproxy.DefaultMaxWait, the wait the documented configuration
// keeps 50 ms below message_timeout.
const DefaultDecisionTimeout = 150 * time.Millisecond

// New returns a Server that runs each request through an intake made
// with opts (intake.WithTrust, intake.WithClassifier,
// intake.WithAdmission, intake.WithQuota, ...). Without admission it
// assigns criticality and refuses nothing but quota.
func New(opts ...intake.Option) (*Server, error) {
	in, err := intake.New(opts...)
	if err != nil {
		return nil, err
	}
	keys, err := egress.New(egress.WithoutPolicy(), egress.WithInternal("*"))
	if err != nil {
		return nil, err
	}
	return &Server{in: in, keys: keys}, nil
}

// NewPerCluster is New with one admission controller for each upstream
// cluster Envoy names in the request attribute ClusterAttribute (add it to
// the filter's request_attributes), so that behind a gateway one service
// at its limit does not refuse another's requests. admit makes a
// cluster's controller on its first request, and the default one, for
// requests that name no cluster, at once (cluster ""); it replaces any
// intake.WithAdmission in opts. Up to MaxClusters clusters get their own;
// requests to others, and to a cluster whose admit failed, share the
// default.
func NewPerCluster(admit func(cluster string) (*admission.Controller, error), opts ...intake.Option) (*Server, error) {
	ctl, err := admit("")
	if err != nil {
		return nil, err
	}
	opts = slices.Clip(opts)
	s, err := New(append(opts, intake.WithAdmission(ctl))...)
	if err != nil {
		return nil, err
	}
	s.clusters = &clusters{opts: opts, admit: admit, by: map[string]*intake.Intake{}}
	return s, nil
}

// intakeFor returns the intake of the cluster named in attrs.
func (s *Server) intakeFor(attrs ...map[string]*structpb.Struct) *intake.Intake {
	if s.clusters == nil {
		return s.in
	}
	name := attribute(ClusterAttribute, attrs...)
	if name == "" {
		return s.in
	}
	if in := s.clusters.get(name); in != nil {
		return in
	}
	return s.clusters.make(name, s.in)
}

func (c *clusters) get(name string) *intake.Intake {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.by[name]
}

// make makes the intake of a new cluster, or returns def past MaxClusters
// or when admit fails.
func (c *clusters) make(name string, def *intake.Intake) *intake.Intake {
	c.mu.Lock()
	defer c.mu.Unlock()
	if in := c.by[name]; in != nil {
		return in
	}
	if len(c.by) >= MaxClusters {
		return def
	}
	ctl, err := c.admit(name)
	if err != nil {
		return def
	}
	in, err := intake.New(append(c.opts, intake.WithAdmission(ctl))...)
	if err != nil {
		return def
	}
	c.by[name] = in
	return in
}

// Register registers s on gs as Envoy's ExternalProcessor.
func (s *Server) Register(gs *grpc.Server) { extprocv3.RegisterExternalProcessorServer(gs, s) }

// Process serves one HTTP request's stream, as Envoy sends it.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	var h *intake.Handle
	defer func() {
		if h != nil {
			h.Finish()
		}
	}()
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil // the request is over, or Envoy reset it
		}
		if err != nil {
			return err
		}
		var resp *extprocv3.ProcessingResponse
		switch r := req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			if h != nil {
				return status.Error(codes.InvalidArgument, "triageextproc: request headers twice on one stream")
			}
			var refused bool
			resp, h, refused, err = s.requestHeaders(stream.Context(), req, r.RequestHeaders)
			if err != nil {
				return err
			}
			if refused {
				return stream.Send(resp) // Envoy answers the client and ends the stream
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			if h != nil {
				h.Finish()
				h = nil
			}
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		default:
			resp = passThrough(req)
		}
		if resp == nil {
			continue // observability mode or a message that needs no answer
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// passThrough answers a body or trailers message unchanged; nil for a
// message that takes no answer.
func passThrough(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	if req.ObservabilityMode {
		return nil
	}
	switch req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
	}
	return nil
}

// start starts h within the decision timeout: a request still waiting for
// a slot then is refused as task overloaded (reason deadline), before
// Envoy's message_timeout lets it through unprocessed.
func (s *Server) start(h *intake.Handle) error {
	bound := s.DecisionTimeout
	if bound <= 0 {
		bound = DefaultDecisionTimeout
	}
	return h.StartWithin(bound)
}

// requestHeaders decides on a request: the response to send, the
// admitted request's Handle (nil if refused), and whether it was
// refused.
func (s *Server) requestHeaders(ctx context.Context, req *extprocv3.ProcessingRequest, hh *extprocv3.HttpHeaders) (*extprocv3.ProcessingResponse, *intake.Handle, bool, error) {
	ir, claims, err := requestOf(req, hh)
	if errors.Is(err, errTooManyHeaders) {
		return tooManyHeaders(), nil, true, nil
	}
	if err != nil {
		return nil, nil, false, status.Error(codes.InvalidArgument, err.Error())
	}
	sent := triageKeys(ir.Header)
	grpcReq := grpcwire.IsGRPC(first(ir.Header, "content-type"))
	if d, ok := grpcwire.ParseTimeout(first(ir.Header, "grpc-timeout")); ok && grpcReq {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	in := s.intakeFor(req.Attributes, hh.Attributes)
	ir.HealthCheck = slices.Contains(s.HealthChecks, ir.Path)
	if s.Group != nil && in.NeedsGroup() {
		ir.Group = s.Group(func(name string) string { return first(ir.Header, strings.ToLower(name)) })
	}
	h, err := in.Accept(ctx, &ir)
	if err == nil {
		err = s.start(h)
	}
	if err != nil { // Accept refused, or Start finished the request
		if oe, ok := outcome.As(err); ok && oe.Kind.Overload() {
			return refusal(oe, grpcReq), nil, true, nil
		}
		return nil, nil, false, status.FromContextError(err).Err() // Envoy reset the stream while it waited
	}
	call := s.keys.Begin(h, ir.Host)
	k, _ := call.Keys(h)
	call.End()
	k.Attempt = attempt.Incoming(h)
	return admitted(k, append(sent, claims...)), h, false, nil
}

// errTooManyHeaders is requestOf's error for a request over MaxHeaders.
var errTooManyHeaders = fmt.Errorf("triageextproc: more than %d request headers", MaxHeaders)

// tooManyHeaders answers a request over MaxHeaders: 431.
func tooManyHeaders() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode_RequestHeaderFieldsTooLarge},
		Body:    []byte(errTooManyHeaders.Error() + "\n"),
		Details: "triage_too_many_headers",
	}}}
}

// requestOf builds the intake's Request from Envoy's headers and
// attributes, a claim header (wire.ClaimPrefix) read as the key it names;
// claims are the claim headers' names.
func requestOf(req *extprocv3.ProcessingRequest, hh *extprocv3.HttpHeaders) (ir intake.Request, claims []string, err error) {
	ir = intake.Request{Case: intake.LowerCase, Header: map[string][]string{}}
	if hh.GetHeaders() != nil && len(hh.Headers.Headers) > MaxHeaders {
		return ir, nil, errTooManyHeaders
	}
	for _, hv := range hh.GetHeaders().GetHeaders() {
		v := hv.Value
		if len(hv.RawValue) > 0 {
			v = string(hv.RawValue)
		}
		k := strings.ToLower(hv.Key)
		if key, ok := wire.Claimed(k); ok { // the caller's key, moved by Envoy's filter (docs/envoy.md)
			claims = append(claims, k)
			k = key
		}
		switch k {
		case ":authority":
			ir.Host = v
		case ":path":
			ir.Path = decodedPath(v)
		}
		if !strings.HasPrefix(k, ":") {
			ir.Header[k] = append(ir.Header[k], v)
		}
	}
	if ir.Host == "" {
		ir.Host = first(ir.Header, "host")
	}
	ir.Peer = peerOf(req.Attributes, hh.Attributes)
	return ir, claims, nil
}

// decodedPath is the path part of a :path header with its percent-encoding
// decoded once, as the upstream will read it, so that the edge's rules
// (which resolve "." and ".." segments) match "/checkout/%2e%2e/batch" as
// "/batch". A malformed escape leaves the path as it came.
func decodedPath(v string) string {
	p, _, _ := strings.Cut(v, "?")
	if !strings.Contains(p, "%") {
		return p
	}
	d, err := url.PathUnescape(p)
	if err != nil {
		return p
	}
	return d
}

// peerOf reads the downstream peer from Envoy's attributes.
func peerOf(sets ...map[string]*structpb.Struct) trust.Peer {
	var p trust.Peer
	for _, attrs := range sets {
		for _, st := range attrs {
			f := st.GetFields()
			if v := f[SourceAddressAttribute].GetStringValue(); v != "" {
				if ap, err := netip.ParseAddrPort(v); err == nil {
					p.Addr = ap.Addr().Unmap()
				} else if a, err := netip.ParseAddr(v); err == nil {
					p.Addr = a.Unmap()
				}
			}
			if v := f[PeerURISANAttribute].GetStringValue(); v != "" {
				p.Identities = append(p.Identities, v)
			}
		}
	}
	return p
}

// attribute is the string value of the request attribute name.
func attribute(name string, sets ...map[string]*structpb.Struct) string {
	for _, attrs := range sets {
		for _, st := range attrs {
			if v := st.GetFields()[name].GetStringValue(); v != "" {
				return v
			}
		}
	}
	return ""
}

// triageKeys returns the triage header names in h.
func triageKeys(h map[string][]string) []string {
	var out []string
	for k := range h {
		if wire.IsTriage(k) {
			out = append(out, k)
		}
	}
	return out
}

func first(h map[string][]string, k string) string {
	if v := h[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// admitted is the answer that lets a request through: the request's own
// keys set, and every other triage header or claim in sent removed.
func admitted(k egress.Keys, sent []string) *extprocv3.ProcessingResponse {
	m := &extprocv3.HeaderMutation{}
	set := func(k, v string) {
		m.SetHeaders = append(m.SetHeaders, &corev3.HeaderValueOption{
			Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		})
	}
	var buf [8]string
	kv := k.Pairs(buf[:0])
	for i := 0; i < len(kv); i += 2 {
		set(kv[i], kv[i+1])
	}
	// The request carries on the keys decided, no other: a key it came
	// with that is not set again (an untrusted caller's, a trusted one's
	// spent decay or malformed customer) is removed.
	for _, key := range sent {
		if !slices.ContainsFunc(m.SetHeaders, func(o *corev3.HeaderValueOption) bool { return o.GetHeader().GetKey() == key }) {
			m.RemoveHeaders = append(m.RemoveHeaders, key)
		}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: m},
	}}}
}

// refusal is the immediate response of an overload outcome.
func refusal(oe *outcome.Error, grpcReq bool) *extprocv3.ProcessingResponse {
	code := typev3.StatusCode(triagehttp.StatusCode(oe.Kind))
	hv := func(k, v string) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
	}
	ir := &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: code},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			hv(wire.OutcomeKey, oe.Kind.Token()),
			hv("retry-after", outcome.FormatRetryAfterSeconds(oe.RetryAfter)),
		}},
		Body:    []byte(oe.Error() + "\n"),
		Details: "triage_" + strings.ReplaceAll(oe.Kind.Token(), "-", "_"),
	}
	if grpcReq {
		// Envoy answers a gRPC request with this status, the body as its
		// message: the compact form triagegrpc reads.
		ir.GrpcStatus = &extprocv3.GrpcStatus{Status: uint32(triagegrpc.Code(oe.Kind))}
		ir.Body = []byte(oe.Error())
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: ir}}
}
