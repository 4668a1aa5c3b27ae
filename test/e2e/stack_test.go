package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/internal/testkit/testcert"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
	"github.com/triagehq/triage/wire"
)

// Source addresses on the loopback network: internal services dial from
// 127.0.0.1 (trusted by the gRPC tiers), a trusted HTTP proxy from
// 127.0.0.2, and outsiders from 127.0.0.3.
const (
	internalIP  = "127.0.0.1"
	trustedIP   = "127.0.0.2"
	untrustedIP = "127.0.0.3"
)

func dialerFrom(ip string) *net.Dialer { return loopback.Dialer(ip, 5*time.Second) }

// grpcFrom dials target from the source IP, with or without triage's client
// interceptors.
func grpcFrom(t *testing.T, target, ip string, withTriage bool, extra ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	d := dialerFrom(ip)
	opts := []grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}),
	}
	if len(extra) == 0 {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	opts = append(opts, extra...)
	if withTriage {
		opts = append(opts, loopback.Client(t, egress.WithoutPolicy()).DialOptions()...)
	}
	cc, err := grpc.NewClient("passthrough:///"+target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// serveGRPC starts a gRPC server for tier on a loopback port.
func serveGRPC(t *testing.T, tier *relay.Tier, srv *triagegrpc.Server, extra ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", internalIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(append(srv.ServerOptions(), extra...)...)
	relay.Register(s, tier)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

func internalTrust(t *testing.T) *trust.Policy {
	p, err := trust.New(trust.Config{Networks: []string{internalIP + "/32"}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// failByBody lets a test ask the last tier to answer with an outcome:
// body "fail:<token>" or "fail:<token>:<retry-after seconds>".
func failByBody(_ context.Context, body string) error {
	rest, ok := strings.CutPrefix(body, "fail:")
	if !ok {
		return nil
	}
	tok, ra, _ := strings.Cut(rest, ":")
	k, ok := outcome.ParseToken(tok)
	if !ok {
		return errors.New("bad test body")
	}
	e := outcome.New(k, "test")
	if ra != "" {
		d, _ := time.ParseDuration(ra + "s")
		e.RetryAfter = d
	}
	return e
}

type stack struct {
	b, a       *relay.Tier
	aAddr      string
	bAddr      string
	httpURL    string
	frontCalls chan string
}

// newStack starts B, A (which calls B) and an HTTP frontend (which calls A).
// A overrides criticality to SHEDDABLE for bodies starting with "prefetch".
func newStack(t *testing.T) *stack {
	t.Helper()
	st := &stack{}
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(internalTrust(t))))
	if err != nil {
		t.Fatal(err)
	}
	st.b = &relay.Tier{Name: "B", Fail: failByBody}
	st.bAddr = serveGRPC(t, st.b, srv)
	st.a = &relay.Tier{
		Name: "A",
		Next: grpcFrom(t, st.bAddr, internalIP, true),
		Override: func(ctx context.Context, body string) context.Context {
			if strings.HasPrefix(body, "prefetch") {
				return criticality.NewContext(ctx, criticality.Sheddable)
			}
			return ctx
		},
	}
	st.aAddr = serveGRPC(t, st.a, srv)
	toA := grpcFrom(t, st.aAddr, internalIP, true)

	rules := edge.MustNew(edge.Config{
		Default: "CRITICAL",
		Rules: []edge.RuleConfig{
			{Header: true},
			{Host: "batch.example.com", Criticality: "SHEDDABLE"},
			{PathPrefix: "/checkout", Criticality: "CRITICAL_PLUS"},
			{PathPrefix: "/suggest", Criticality: "SHEDDABLE_PLUS"},
		},
	})
	mw, err := triagehttp.Middleware(
		triagehttp.WithIntake(intake.WithClassifier(rules),
			intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{trustedIP + "/32"}}))),
	)
	if err != nil {
		t.Fatal(err)
	}
	st.frontCalls = make(chan string, 64)
	front := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/local-overload" {
			triagehttp.WriteError(w, outcome.New(outcome.TaskOverloaded, "frontend busy"))
			return
		}
		// What a handler behind the edge sees of triage headers.
		select {
		case st.frontCalls <- r.Header.Get(wire.CriticalityKey) + "|" + r.Header.Get(wire.AttemptKey) + "|" + r.Header.Get("Triage-Future-Key"):
		default:
		}
		resp, err := relay.Invoke(r.Context(), toA, r.URL.Query().Get("body"))
		if err != nil {
			if !triagehttp.WriteError(w, err) {
				http.Error(w, err.Error(), http.StatusBadGateway)
			}
			return
		}
		fmt.Fprintf(w, "front:%v > %s", criticality.Of(r.Context()), resp)
	})
	lis, err := net.Listen("tcp", internalIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: mw(front), ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(lis)
	t.Cleanup(func() { hs.Close() })
	st.httpURL = "http://" + lis.Addr().String()
	return st
}

func httpClientFrom(ip string) *http.Client { return loopback.HTTPClient(ip, 10*time.Second) }

func get(t *testing.T, c *http.Client, url, host string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, strings.TrimSpace(string(b))
}

func TestCriticalityAcrossTwoGRPCHops(t *testing.T) {
	st := newStack(t)
	outsider := httpClientFrom(untrustedIP)
	proxy := httpClientFrom(trustedIP)
	spoof := map[string]string{"Triage-Criticality": "CRITICAL_PLUS", "Triage-Attempt": "2", "Triage-Future-Key": "x"}
	tests := []struct {
		name   string
		client *http.Client
		path   string
		host   string
		hdr    map[string]string
		want   string
	}{
		{"path rule", outsider, "/checkout/pay?body=x", "", nil,
			"front:CRITICAL_PLUS > A:CRITICAL_PLUS/0 > B:CRITICAL_PLUS/0"},
		{"host rule", outsider, "/?body=x", "batch.example.com", nil,
			"front:SHEDDABLE > A:SHEDDABLE/0 > B:SHEDDABLE/0"},
		{"default", outsider, "/home?body=x", "", nil,
			"front:CRITICAL > A:CRITICAL/0 > B:CRITICAL/0"},
		{"override at the middle hop propagates from there", outsider, "/checkout?body=prefetch", "", nil,
			"front:CRITICAL_PLUS > A:CRITICAL_PLUS/0 > B:SHEDDABLE/0"},
		{"untrusted header ignored", outsider, "/suggest?body=x", "", spoof,
			"front:SHEDDABLE_PLUS > A:SHEDDABLE_PLUS/0 > B:SHEDDABLE_PLUS/0"},
		{"untrusted header ignored (default rule)", outsider, "/?body=x", "", spoof,
			"front:CRITICAL > A:CRITICAL/0 > B:CRITICAL/0"},
		{"trusted header believed", proxy, "/suggest?body=x", "", map[string]string{"Triage-Criticality": "CRITICAL_PLUS"},
			"front:CRITICAL_PLUS > A:CRITICAL_PLUS/0 > B:CRITICAL_PLUS/0"},
		{"trusted but malformed header falls through", proxy, "/suggest?body=x", "", map[string]string{"Triage-Criticality": "critical_plus"},
			"front:SHEDDABLE_PLUS > A:SHEDDABLE_PLUS/0 > B:SHEDDABLE_PLUS/0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := get(t, tt.client, st.httpURL+tt.path, tt.host, tt.hdr)
			if resp.StatusCode != 200 || body != tt.want {
				t.Fatalf("got %d %q\nwant 200 %q", resp.StatusCode, body, tt.want)
			}
			seen := <-st.frontCalls
			if tt.client == outsider && seen != "||" {
				t.Errorf("handler behind the edge saw triage headers from an untrusted peer: %q", seen)
			}
		})
	}
}

// A peer that talks gRPC straight to an inner tier, from an address the
// tier does not trust, cannot set criticality or attempt, and the handler
// does not even see the keys.
func TestUntrustedGRPCPeerCannotSpoof(t *testing.T) {
	st := newStack(t)
	var seenMD metadata.MD
	probe := &relay.Tier{Name: "P", Fail: func(ctx context.Context, _ string) error {
		seenMD, _ = metadata.FromIncomingContext(ctx)
		return nil
	}}
	srv, _ := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(internalTrust(t))))
	addr := serveGRPC(t, probe, srv)
	spoof := metadata.Pairs(wire.CriticalityKey, "CRITICAL_PLUS", wire.AttemptKey, "2", "triage-future-key", "x")
	for _, target := range []string{st.aAddr, addr} {
		cc := grpcFrom(t, target, untrustedIP, false) // a plain client, no triage code
		ctx := metadata.NewOutgoingContext(context.Background(), spoof)
		got, err := relay.Invoke(ctx, cc, "x")
		if err != nil {
			t.Fatal(err)
		}
		if target == st.aAddr && got != "A:CRITICAL/0 > B:CRITICAL/0" {
			t.Errorf("spoofed call through A: %q", got)
		}
	}
	for k := range seenMD {
		if wire.IsTriage(k) {
			t.Errorf("handler saw spoofed key %q", k)
		}
	}
	// The same keys from the trusted internal address are believed.
	cc := grpcFrom(t, st.aAddr, internalIP, false)
	got, err := relay.Invoke(metadata.NewOutgoingContext(context.Background(), spoof), cc, "x")
	if err != nil {
		t.Fatal(err)
	}
	if got != "A:CRITICAL_PLUS/2 > B:CRITICAL_PLUS/0" {
		t.Errorf("trusted call: %q (the attempt counter must not be forwarded to the next hop)", got)
	}
	// Repeated or malformed values from a trusted peer are ignored.
	bad := metadata.Pairs(wire.CriticalityKey, "SHEDDABLE", wire.CriticalityKey, "SHEDDABLE", wire.AttemptKey, "-1")
	got, err = relay.Invoke(metadata.NewOutgoingContext(context.Background(), bad), cc, "x")
	if err != nil || got != "A:CRITICAL/0 > B:CRITICAL/0" {
		t.Errorf("repeated keys: %q, %v", got, err)
	}
}

func TestStreamingPropagation(t *testing.T) {
	st := newStack(t)
	cc := grpcFrom(t, st.aAddr, internalIP, true)
	ctx := criticality.NewContext(context.Background(), criticality.SheddablePlus)
	got, err := relay.InvokeStream(ctx, cc, "x")
	if err != nil {
		t.Fatal(err)
	}
	if got != "A:SHEDDABLE_PLUS/0 > B:SHEDDABLE_PLUS/0" {
		t.Fatalf("stream: %q", got)
	}
	_, err = relay.InvokeStream(ctx, grpcFrom(t, st.bAddr, internalIP, true), "fail:task-overloaded")
	if !errors.Is(err, outcome.ErrTaskOverloaded) {
		t.Fatalf("stream outcome: %v", err)
	}
}

func TestMTLSIdentityTrust(t *testing.T) {
	ca, err := testcert.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(uri string) tls.Certificate {
		c, err := ca.Leaf(uri)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	serverCert := leaf("spiffe://triage.test/b")
	srvTLS := &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: ca.Pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS13}
	pol := trust.MustNew(trust.Config{Identities: []string{"spiffe://triage.test/a"}})
	srv, _ := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(pol), intake.WithCustomerFromIdentity()))
	var customer atomic.Value
	b := &relay.Tier{Name: "B", Fail: func(ctx context.Context, _ string) error {
		customer.Store(quota.CustomerOf(ctx))
		return nil
	}}
	addr := serveGRPC(t, b, srv, grpc.Creds(credentials.NewTLS(srvTLS)))

	call := func(certs []tls.Certificate) string {
		cliTLS := &tls.Config{Certificates: certs, RootCAs: ca.Pool, MinVersion: tls.VersionTLS13}
		cc := grpcFrom(t, addr, internalIP, false, grpc.WithTransportCredentials(credentials.NewTLS(cliTLS)))
		// Every caller claims to be acting for the customer "gmail".
		ctx := metadata.AppendToOutgoingContext(context.Background(), wire.CriticalityKey, "SHEDDABLE", wire.CustomerKey, "gmail")
		got, err := relay.Invoke(ctx, cc, "x")
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	// The trusted frontend's claim is believed; an untrusted caller's is
	// dropped and it spends its own (certificate) identity's quota; a
	// caller without a certificate is nobody in particular.
	if got := call([]tls.Certificate{leaf("spiffe://triage.test/a")}); got != "B:SHEDDABLE/0" || customer.Load() != "gmail" {
		t.Errorf("trusted identity: %q, customer %q", got, customer.Load())
	}
	if got := call([]tls.Certificate{leaf("spiffe://triage.test/rogue")}); got != "B:CRITICAL/0" || customer.Load() != "spiffe://triage.test/rogue" {
		t.Errorf("untrusted identity: %q, customer %q", got, customer.Load())
	}
	if got := call(nil); got != "B:CRITICAL/0" || customer.Load() != "" {
		t.Errorf("no client certificate: %q, customer %q", got, customer.Load())
	}
}

func TestOutcomesRoundTrip(t *testing.T) {
	st := newStack(t)
	plainB := grpcFrom(t, st.bAddr, internalIP, false)
	triageB := grpcFrom(t, st.bAddr, internalIP, true)
	triageA := grpcFrom(t, st.aAddr, internalIP, true)
	tests := []struct {
		kind       outcome.Kind
		retryAfter int
		code       codes.Code
		reason     string
		viaA       outcome.Kind
	}{
		{outcome.TaskOverloaded, 0, codes.Unavailable, "TASK_OVERLOADED", outcome.DontRetry},
		{outcome.DontRetry, 0, codes.ResourceExhausted, "OVERLOADED_DONT_RETRY", outcome.DontRetry},
		{outcome.OutOfQuota, 7, codes.ResourceExhausted, "OUT_OF_QUOTA", outcome.OutOfQuota},
	}
	for _, tt := range tests {
		t.Run(tt.kind.Token(), func(t *testing.T) {
			body := "fail:" + tt.kind.Token()
			if tt.retryAfter > 0 {
				body += fmt.Sprintf(":%d", tt.retryAfter)
			}
			// A plain grpc-go client decodes the standard details.
			_, err := relay.Invoke(context.Background(), plainB, body)
			s := status.Convert(err)
			if s.Code() != tt.code {
				t.Fatalf("plain client: code %v, want %v", s.Code(), tt.code)
			}
			var info *errdetails.ErrorInfo
			var retry *errdetails.RetryInfo
			for _, d := range s.Details() {
				switch d := d.(type) {
				case *errdetails.ErrorInfo:
					info = d
				case *errdetails.RetryInfo:
					retry = d
				}
			}
			if info == nil || info.Reason != tt.reason || info.Domain != triagegrpc.ErrorDomain {
				t.Fatalf("plain client: ErrorInfo %v", info)
			}
			if tt.retryAfter > 0 && (retry == nil || retry.RetryDelay.AsDuration() != time.Duration(tt.retryAfter)*time.Second) {
				t.Fatalf("plain client: RetryInfo %v", retry)
			}
			// A triage client gets a typed outcome that still is a status.
			_, err = relay.Invoke(context.Background(), triageB, body)
			oe, ok := outcome.As(err)
			if !ok || oe.Kind != tt.kind || !oe.Downstream || oe.RetryAfter != time.Duration(tt.retryAfter)*time.Second {
				t.Fatalf("triage client: %#v", err)
			}
			if status.Code(err) != tt.code {
				t.Errorf("triage client: status.Code = %v", status.Code(err))
			}
			// One hop up, A passes it on: only the layer directly above
			// the rejecting one may retry.
			_, err = relay.Invoke(context.Background(), triageA, body)
			if got := outcome.Classify(err); got != tt.viaA {
				t.Errorf("through A: %v, want %v (%v)", got, tt.viaA, err)
			}
			// Through the HTTP frontend, as a plain HTTP client sees it.
			resp, _ := get(t, httpClientFrom(untrustedIP), st.httpURL+"/?body="+body, "", nil)
			wantStatus := triagehttp.StatusCode(tt.viaA)
			if resp.StatusCode != wantStatus || resp.Header.Get("Triage-Outcome") != tt.viaA.Token() {
				t.Errorf("HTTP: %d %q, want %d %q", resp.StatusCode, resp.Header.Get("Triage-Outcome"), wantStatus, tt.viaA.Token())
			}
			if got := resp.Header.Get("Retry-After"); got != fmt.Sprint(tt.retryAfter) {
				t.Errorf("HTTP Retry-After %q, want %d", got, tt.retryAfter)
			}
			if he, ok := triagehttp.FromResponse(resp); !ok || he.Kind != tt.viaA {
				t.Errorf("FromResponse: %v, %v", he, ok)
			}
		})
	}
	// An outcome the frontend creates itself stays retriable.
	resp, _ := get(t, httpClientFrom(untrustedIP), st.httpURL+"/local-overload", "", nil)
	if resp.StatusCode != 503 || resp.Header.Get("Triage-Outcome") != "task-overloaded" || resp.Header.Get("Retry-After") != "0" {
		t.Errorf("local overload: %d %v", resp.StatusCode, resp.Header)
	}
}

// The HTTP client side: Transport carries criticality and attempt to a
// triage HTTP service, replacing stale values.
func TestHTTPTransportPropagates(t *testing.T) {
	seen := make(chan string, 1)
	mw, err := triagehttp.Middleware(triagehttp.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{internalIP + "/32"}}))))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", internalIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- fmt.Sprintf("%v|%s", criticality.Of(r.Context()), r.Header.Values("Triage-Criticality"))
	}))}
	go hs.Serve(lis)
	defer hs.Close()
	// Only to hosts marked internal: any other host gets no triage header
	// at all (issue 21, item 10).
	for _, tc := range []struct {
		internal []string
		want     string
	}{
		{[]string{internalIP}, "SHEDDABLE_PLUS|[SHEDDABLE_PLUS]"},
		{[]string{"backend.internal", ".svc.cluster.local"}, criticality.Default.String() + "|[]"},
		{nil, criticality.Default.String() + "|[]"},
	} {
		c := &http.Client{Transport: &triagehttp.Transport{Base: &http.Transport{DialContext: dialerFrom(internalIP).DialContext}, Caller: internalCaller(t, tc.internal)}, Timeout: 10 * time.Second}
		ctx := criticality.NewContext(context.Background(), criticality.SheddablePlus)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+lis.Addr().String()+"/", nil)
		req.Header.Set("Triage-Criticality", "CRITICAL_PLUS") // stale, forwarded by mistake
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := <-seen; got != tc.want {
			t.Errorf("internal %v: server saw %q, want %q", tc.internal, got, tc.want)
		}
		if req.Header.Get("Triage-Criticality") != "CRITICAL_PLUS" {
			t.Error("Transport modified the caller's request")
		}
	}
}

// internalCaller returns a Caller without a policy whose internal hosts
// are hosts.
func internalCaller(t *testing.T, hosts []string) *egress.Caller {
	t.Helper()
	c, err := egress.New(egress.WithoutPolicy(), egress.WithInternal(hosts...))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
