package triageextproc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

// envoy stands in for Envoy's ext_proc HTTP filter (envoy v1.40 API), as
// far as a processor can observe it: one stream per HTTP request,
// opened when the request's headers arrive; the request headers first,
// with the pseudo-headers, each value in raw_value, and the request
// attributes; with request_body_mode BUFFERED the whole body next; then,
// once the upstream answered, the response headers (response_header_mode
// SEND, the default); each message answered within message_timeout;
// the stream closed when the request ends, reset when the client goes
// away. Its failure handling is the filter's, per its documentation:
//
//   - the processor cannot be reached, or ends the stream with an
//     error: 500, or with failure_mode_allow the request goes on
//     unprocessed;
//   - a message is not answered within message_timeout: 504, or with
//     failure_mode_allow the request goes on unprocessed;
//   - the processor ends the stream cleanly: the request goes on
//     unprocessed;
//   - an immediate response: sent to the client as it is (for a gRPC
//     request with grpc_status, HTTP 200 with grpc-status and the body as
//     grpc-message).
type envoy struct {
	cc          *grpc.ClientConn
	upstream    string // http://host:port
	failOpen    bool
	bufferBody  bool
	timeout     func() <-chan time.Time // message_timeout; nil: never
	peer        string                  // the downstream's source.address
	noAttribute bool
	before      func(http.Header) // the filters before ext_proc, if any
	cluster     string            // the xds.cluster_name attribute, if any
	authority   string            // the requests' :authority; "" for shop.example
}

// answer is what the client got, what the upstream saw, and how.
type answer struct {
	status       int
	header       http.Header
	body         string
	upstreamSaw  http.Header // nil: the upstream was not called
	upstreamBody string
	how          string // "processed", "immediate", "unprocessed (…)", "local reply (…)"
}

func dialEnvoy(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// do sends one request through the filter, as Envoy would.
func (e *envoy) do(ctx context.Context, method, path string, h http.Header, body []byte) answer {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the stream is reset if still open
	if e.before != nil {
		e.before(h)
	}
	stream, err := extprocv3.NewExternalProcessorClient(e.cc).Process(ctx)
	if err != nil {
		return e.failure(ctx, method, path, h, body, "processor unreachable", http.StatusInternalServerError)
	}
	if err := stream.Send(e.requestHeaders(method, path, h, body == nil)); err != nil {
		return e.failure(ctx, method, path, h, body, "send failed", http.StatusInternalServerError)
	}
	resp, fail := e.recv(stream)
	if fail != nil {
		return e.failure(ctx, method, path, h, body, fail.why, fail.status)
	}
	if resp == nil {
		return e.forward(ctx, method, path, h, body, "unprocessed (stream closed cleanly)")
	}
	if ir := resp.GetImmediateResponse(); ir != nil {
		return immediate(ir)
	}
	mutate(h, resp.GetRequestHeaders().GetResponse().GetHeaderMutation())
	if body != nil && e.bufferBody {
		if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
			return e.failure(ctx, method, path, h, body, "send failed", http.StatusInternalServerError)
		}
		if resp, fail = e.recv(stream); fail != nil {
			return e.failure(ctx, method, path, h, body, fail.why, fail.status)
		}
		if resp.GetRequestBody() == nil {
			return answer{status: 500, how: "local reply (unexpected answer to the body)"}
		}
	}
	a := e.call(ctx, method, path, h, body)
	rh := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: headerMap(map[string]string{":status": fmt.Sprint(a.status)}, a.header), EndOfStream: a.body == ""}}}
	if err := stream.Send(rh); err != nil {
		return answer{status: 500, how: "local reply (send failed)"}
	}
	if resp, fail = e.recv(stream); fail != nil && !e.failOpen {
		return answer{status: fail.status, how: "local reply (" + fail.why + ", response phase)"}
	}
	mutate(a.header, resp.GetResponseHeaders().GetResponse().GetHeaderMutation())
	stream.CloseSend()
	a.how = "processed"
	return a
}

type failed struct {
	why    string
	status int
}

// recv waits for the processor's answer to one message, for at most
// message_timeout; nil, nil when the processor closed the stream cleanly.
func (e *envoy) recv(stream extprocv3.ExternalProcessor_ProcessClient) (*extprocv3.ProcessingResponse, *failed) {
	type got struct {
		resp *extprocv3.ProcessingResponse
		err  error
	}
	ch := make(chan got, 1)
	go func() {
		r, err := stream.Recv()
		ch <- got{r, err}
	}()
	var timeout <-chan time.Time
	if e.timeout != nil {
		timeout = e.timeout()
	}
	select {
	case g := <-ch:
		switch {
		case errors.Is(g.err, io.EOF):
			return nil, nil
		case g.err != nil:
			return nil, &failed{"gRPC error: " + g.err.Error(), http.StatusInternalServerError}
		}
		return g.resp, nil
	case <-timeout:
		return nil, &failed{"message timeout", http.StatusGatewayTimeout}
	}
}

// failure is the filter's failure mode.
func (e *envoy) failure(ctx context.Context, method, path string, h http.Header, body []byte, why string, status int) answer {
	if e.failOpen {
		return e.forward(ctx, method, path, h, body, "unprocessed ("+why+", failure_mode_allow)")
	}
	return answer{status: status, how: "local reply (" + why + ")"}
}

func (e *envoy) forward(ctx context.Context, method, path string, h http.Header, body []byte, how string) answer {
	a := e.call(ctx, method, path, h, body)
	a.how = how
	return a
}

// call sends the request, as it now is, to the upstream.
func (e *envoy) call(ctx context.Context, method, path string, h http.Header, body []byte) answer {
	req, err := http.NewRequestWithContext(ctx, method, e.upstream+path, bytes.NewReader(body))
	if err != nil {
		return answer{status: 500, how: "local reply (" + err.Error() + ")"}
	}
	req.Header = h.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{status: 503, how: "local reply (upstream: " + err.Error() + ")"}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b),
		upstreamSaw: http.Header{"Seen": {resp.Header.Get("X-Seen")}}, upstreamBody: resp.Header.Get("X-Seen-Body")}
}

// requestHeaders is the filter's first message.
func (e *envoy) requestHeaders(method, path string, h http.Header, endOfStream bool) *extprocv3.ProcessingRequest {
	authority := e.authority
	if authority == "" {
		authority = "shop.example"
	}
	pseudo := map[string]string{":method": method, ":path": path, ":authority": authority, ":scheme": "http"}
	req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: headerMap(pseudo, h), EndOfStream: endOfStream}}}
	if !e.noAttribute {
		attrs, _ := structpb.NewStruct(map[string]any{"source.address": e.peer})
		req.Attributes = map[string]*structpb.Struct{"envoy.filters.http.ext_proc": attrs}
	}
	clusterAttributes(req, e.cluster)
	return req
}

// headerMap is Envoy's HeaderMap: pseudo-headers first, names lower
// case, values in raw_value.
func headerMap(pseudo map[string]string, h http.Header) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for k, v := range pseudo {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	for k, vs := range h {
		for _, v := range vs {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
		}
	}
	return m
}

// mutate applies a header mutation as Envoy does.
func mutate(h http.Header, m *extprocv3.HeaderMutation) {
	for _, k := range m.GetRemoveHeaders() {
		h.Del(k)
	}
	for _, o := range m.GetSetHeaders() {
		v := o.GetHeader().GetValue()
		if raw := o.GetHeader().GetRawValue(); len(raw) > 0 {
			v = string(raw)
		}
		switch o.GetAppendAction() {
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
			h.Set(o.GetHeader().GetKey(), v)
		default:
			h.Add(o.GetHeader().GetKey(), v)
		}
	}
}

// immediate is the local reply Envoy sends for an immediate response.
func immediate(ir *extprocv3.ImmediateResponse) answer {
	a := answer{status: int(ir.GetStatus().GetCode()), header: http.Header{}, body: string(ir.GetBody()), how: "immediate (" + ir.GetDetails() + ")"}
	mutate(a.header, ir.GetHeaders())
	if gs := ir.GetGrpcStatus(); gs != nil {
		a.status = http.StatusOK
		a.header.Set("Grpc-Status", fmt.Sprint(gs.GetStatus()))
		a.header.Set("Grpc-Message", a.body)
		a.body = ""
	}
	return a
}

// echoUpstream answers with what it saw: the triage headers and the body.
func echoUpstream() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var seen []string
		for k, v := range r.Header {
			if lk := strings.ToLower(k); strings.HasPrefix(lk, "triage-") || strings.HasPrefix(lk, "triage_") || strings.HasPrefix(lk, "x-triage-claimed-") {
				seen = append(seen, strings.ToLower(k)+"="+strings.Join(v, ","))
			}
		}
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Seen", strings.Join(slices.Sorted(slices.Values(seen)), " "))
		w.Header().Set("X-Seen-Body", string(b))
		io.WriteString(w, "ok")
	}))
}

// listen serves s on loopback and returns its address.
func listen(register func(*grpc.Server)) (string, func(), error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	gs := grpc.NewServer()
	register(gs)
	go gs.Serve(lis)
	return lis.Addr().String(), gs.Stop, nil
}

// extprocEnvoyStream starts a CRITICAL_PLUS request and stops after the
// processor let it through: it holds its execution slot until the stream
// ends.
func extprocEnvoyStream(e *envoy) (extprocv3.ExternalProcessor_ProcessClient, error) {
	stream, err := extprocv3.NewExternalProcessorClient(e.cc).Process(context.Background())
	if err != nil {
		return nil, err
	}
	if err := stream.Send(e.requestHeaders("GET", "/hold", http.Header{"Triage-Criticality": {"CRITICAL_PLUS"}}, true)); err != nil {
		return nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if resp.GetRequestHeaders() == nil {
		return nil, fmt.Errorf("holding request not let through: %v", resp)
	}
	return stream, nil
}
