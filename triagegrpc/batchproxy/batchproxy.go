package batchproxy

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/triagegrpc/internal/forward"
	"github.com/triagehq/triage/wire"
)

// Proxy forwards any gRPC method, unary or streaming, to a backend
// connection without knowing its message types: the batch proxy of SRE
// book ch. 21, "Load from Connections" ("batch client -> batch proxy ->
// backend"). Batch clients hold their connections to the proxy; the proxy
// holds few to the backends (its ClientConn, with a larger subset), and
// its own admission control sheds its clients when a huge job starts, so
// that the backends never see the storm: it acts as a fuse.
//
// Install the Proxy's ServerOptions on a grpc.Server next to a Server's
// (criticality, trust, admission): the incoming criticality and attempt
// counter (forwarded as it came: the proxy is no retrying hop of its own),
// and the customer, from trusted peers only, go out through the backend connection's
// Client interceptors, the deadline through the context, and a backend's
// overload rejection comes back up as "overloaded; don't retry" (the proxy
// is the layer that may retry; the batch client above it may not).
// Messages are copied once each way; each call holds one extra goroutine
// (the client-to-backend half) that ends with the call. A Proxy is safe
// for concurrent use; the calls it holds are bounded by its server's
// admission control.
type Proxy struct {
	cc    grpc.ClientConnInterface
	codec forward.Codec
}

// Defaults for a batch proxy's own admission control (admission.WithMaxWait,
// admission.WithQueueFactor and admission.WithTolerance on its
// Controller).
//
// The tolerance: the proxy's service time is the backends' latency, so its
// execution limit grows only while that latency stays within 1.2 x its
// recent best (a backend's default is 2 x): a batch job through the proxy
// may slow the backends' other callers little, not double their latency.
// (bench/cmd/batchjob: interactive p99 7.2 ms during a job against 33.7 ms
// with 2 x, the job 6% slower.)
//
// The queue: a backend's defaults (50 ms, 4) suit interactive callers, who would rather be refused at once
// and try another task; a batch job's callers would rather wait at the
// proxy than be refused, because a refused batch task backs off for
// seconds and its own adaptive throttling, fed few requests, stays shut
// for minutes. So the proxy queues up to 64 x L + 8 calls (L its execution
// limit, which admission.WithLimits bounds) for up to a second each, and
// sheds beyond that.
const (
	DefaultMaxWait     = time.Second
	DefaultQueueFactor = 64
	DefaultTolerance   = 1.2
)

// New returns a Proxy that forwards to cc, a connection set up with
// a Client's DialOptions (and, typically, triage's balancer).
func New(cc grpc.ClientConnInterface) (*Proxy, error) {
	if cc == nil {
		return nil, errors.New("batchproxy: New needs a backend connection")
	}
	if encoding.GetCodecV2("proto") == nil {
		return nil, errors.New("batchproxy: no proto codec registered")
	}
	return &Proxy{cc: cc, codec: forward.NewCodec()}, nil
}

// ServerOptions make every method the server does not itself implement
// forwarded to the backends. The server keeps its own services (health,
// for one): their messages are decoded as usual.
func (p *Proxy) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.UnknownServiceHandler(p.handle), grpc.ForceServerCodecV2(p.codec)}
}

// forwardedHeader says whether an incoming header goes on to the backend:
// not HTTP/2 pseudo-headers, not gRPC's own, not the transport's, and not
// triage's (the Client interceptors write the trusted values afresh).
func forwardedHeader(k string) bool {
	switch {
	case strings.HasPrefix(k, ":"), strings.HasPrefix(k, "grpc-"), wire.IsTriage(k):
		return false
	case k == "content-type", k == "user-agent":
		return false
	}
	return true
}

// returnedTrailer says whether a backend's trailer goes back to the
// client: not the backend's load report nor its lame-duck notice, which
// speak of the backend, not of the proxy the client balances over.
func returnedTrailer(k string) bool {
	return k != wire.LoadReportKey && !wire.IsTriage(k)
}

func filterMD(md metadata.MD, keep func(string) bool) metadata.MD {
	out := make(metadata.MD, len(md))
	for k, v := range md {
		if keep(k) {
			out[k] = v
		}
	}
	return out
}

var proxyDesc = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// pump sends the client's messages after the first to the backend, then
// half-closes; it says how it ended on up (buffered: it never blocks) and
// returns when the client's side ends, or the call does.
func (p *Proxy) pump(ss grpc.ServerStream, cs grpc.ClientStream, up chan<- error) {
	for {
		var f forward.Frame
		if err := ss.RecvMsg(&f); err != nil {
			if err == io.EOF {
				up <- cs.CloseSend()
			} else {
				up <- err
			}
			return
		}
		if err := cs.SendMsg(&f); err != nil {
			up <- nil // the backend's side ended: its status comes from RecvMsg
			return
		}
	}
}

// handle forwards one call: the client's first message and the backend's
// answers in this goroutine, the client's further messages in pump.
func (p *Proxy) handle(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return status.Error(codes.Internal, "triagegrpc proxy: no method name")
	}
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	in, _ := metadata.FromIncomingContext(ctx)
	ctx = metadata.NewOutgoingContext(ctx, filterMD(in, forwardedHeader))
	// The proxy is no hop of its own: a batch client's retry is still a
	// retry when it reaches the backend, whose attempt histogram counts it.
	ctx = attempt.NewOutgoingContext(ctx, attempt.Incoming(ctx))
	// The first message is read here, so that the backend stream opens
	// with it at hand: its headers and first message leave together.
	var first forward.Frame
	firstErr := ss.RecvMsg(&first)
	if firstErr != nil && firstErr != io.EOF {
		return firstErr
	}
	cs, err := p.cc.NewStream(ctx, proxyDesc, method, grpc.ForceCodecV2(p.codec), forward.Clean{})
	if err != nil {
		return err
	}
	up := make(chan error, 1)
	if firstErr == io.EOF {
		up <- cs.CloseSend() // a stream with no message from the client
	} else if err := cs.SendMsg(&first); err != nil {
		up <- nil // the backend's side ended: its status comes from RecvMsg
	} else {
		go p.pump(ss, cs, up)
	}
	headerSent := false
	for {
		var f forward.Frame
		err := cs.RecvMsg(&f)
		if !headerSent {
			// SetHeader, not SendHeader: the headers leave with the first
			// message or the status, in one write.
			if h, herr := cs.Header(); herr == nil && len(h) > 0 {
				ss.SetHeader(filterMD(h, returnedTrailer))
			}
			headerSent = true
		}
		if err != nil {
			ss.SetTrailer(filterMD(cs.Trailer(), returnedTrailer))
			if err == io.EOF {
				return nil
			}
			return err
		}
		if err := ss.SendMsg(&f); err != nil {
			return err
		}
		select {
		case err := <-up:
			if err != nil && err != io.EOF {
				return err // the client's side failed: cancel the backend call
			}
			up = nil // done sending; keep relaying the backend's answers
		default:
		}
	}
}
