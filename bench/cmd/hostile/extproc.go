package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/triagehq/triage/bench/internal/triagebin"
)

// The processor's rows: `triage extproc` (defaults, -trust 127.0.0.1/32)
// asked about every request as Envoy's ext_proc filter asks, by a Go
// stand-in (one stream per request: the request headers with the
// source.address attribute, then, once the upstream answered, the
// response headers). The attackers' requests come from 192.0.2.7, an
// address the processor does not trust; the CRITICAL caller's from
// 127.0.0.1. A caller's request is served when the processor lets it
// through within Envoy's message_timeout (200 ms, docs/envoy.md).

// procAttack is one processor row: what Envoy forwards from a hostile
// caller, sent until ctx ends.
type procAttack struct {
	name string
	run  func(ctx context.Context, p extprocv3.ExternalProcessorClient)
}

const messageTimeout = 200 * time.Millisecond

var procAttacks = []procAttack{
	{"300 headers a request, 1,000 requests/s", func(ctx context.Context, p extprocv3.ExternalProcessorClient) {
		var h []string
		for i := range 300 {
			h = append(h, fmt.Sprintf("x-flood-%d", i), "a")
		}
		procLoop(ctx, p, 1000, nil, h...)
	}},
	{"500 distinct triage-* headers a request, 1,000 requests/s", func(ctx context.Context, p extprocv3.ExternalProcessorClient) {
		var h []string
		for i := range 500 {
			h = append(h, fmt.Sprintf("triage-flood-%d", i), "CRITICAL_PLUS")
		}
		procLoop(ctx, p, 1000, nil, h...)
	}},
	{"gRPC calls with huge, negative and malformed grpc-timeout, 1,000/s", func(ctx context.Context, p extprocv3.ExternalProcessorClient) {
		procLoop(ctx, p, 1000, nil, "content-type", "application/grpc", "grpc-timeout", "99999999H", "triage-criticality", "CRITICAL_PLUS")
	}},
	{"a forged x-forwarded-client-cert and CRITICAL_PLUS claims, 1,000/s", func(ctx context.Context, p extprocv3.ExternalProcessorClient) {
		procLoop(ctx, p, 1000, nil, "x-forwarded-client-cert", `By=spiffe://cluster.local/ns/shop/sa/shop;URI=spiffe://cluster.local/ns/shop/sa/frontend`,
			"triage-criticality", "CRITICAL_PLUS", "x-triage-claimed-criticality", "CRITICAL_PLUS")
	}},
	{"one address, 2,000 requests/s to an upstream that serves 800/s (4 workers, 5 ms each)", func(ctx context.Context, p extprocv3.ExternalProcessorClient) {
		procLoop(ctx, p, 2000, upstreamWork)
	}},
}

// workers is the upstream behind Envoy: 4 workers, each request 5 ms of
// one (800 requests/s); a request waits for a free worker.
var workers = make(chan struct{}, 4)

// upstreamWork is one request at the upstream.
func upstreamWork() {
	workers <- struct{}{}
	time.Sleep(5 * time.Millisecond)
	<-workers
}

// procLoop sends rate requests a second from the attacker, each on its
// stream: the request headers (and headers), then after upstream the
// response headers if the processor let it through.
func procLoop(ctx context.Context, p extprocv3.ExternalProcessorClient, rate int, upstream func(), headers ...string) {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	var inflight atomic.Int64
	for ctx.Err() == nil {
		if inflight.Load() < 10_000 {
			inflight.Add(1)
			go func() {
				defer inflight.Add(-1)
				procRequest(ctx, p, "192.0.2.7:40000", upstream, headers...)
			}()
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// procRequest is one request as Envoy's filter sends it; it reports
// whether the processor let it through within the message timeout.
func procRequest(ctx context.Context, p extprocv3.ExternalProcessorClient, peer string, upstream func(), headers ...string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := p.Process(ctx)
	if err != nil {
		return false, err
	}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/checkout")},
		{Key: ":authority", RawValue: []byte("shop")}, {Key: ":scheme", RawValue: []byte("http")}}}
	for i := 0; i+1 < len(headers); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: headers[i], RawValue: []byte(headers[i+1])})
	}
	attrs, _ := structpb.NewStruct(map[string]any{"source.address": peer})
	start := time.Now()
	if err := s.Send(&extprocv3.ProcessingRequest{
		Attributes: map[string]*structpb.Struct{"envoy.filters.http.ext_proc": attrs},
		Request:    &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: true}},
	}); err != nil {
		return false, err
	}
	resp, err := s.Recv()
	if err != nil {
		return false, err
	}
	in := time.Since(start)
	if resp.GetRequestHeaders() == nil {
		return false, fmt.Errorf("refused: %v", resp.GetImmediateResponse().GetStatus().GetCode())
	}
	if upstream != nil {
		upstream()
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}, EndOfStream: true}}})
	s.Recv()
	s.CloseSend()
	if in > messageTimeout {
		return false, fmt.Errorf("answered after %v, past message_timeout", in)
	}
	return true, nil
}

// procRows runs the processor's rows.
func procRows(bin string, dur time.Duration, only string) error {
	fmt.Printf("\n| attack on triage extproc (%v, from 192.0.2.7, untrusted) | CRITICAL caller served during | recovery after | the processor at the attack's end |\n|---|---|---|---|\n", dur)
	return printRows(procAttacks, only, func(a procAttack) (string, error) { return procRow(bin, a, dur) })
}

func procRow(bin string, a procAttack, dur time.Duration) (string, error) {
	metrics, err := freeAddr()
	if err != nil {
		return "", err
	}
	ep, err := triagebin.Start(bin, "extproc", "-listen", "127.0.0.1:0", "-drain", "0s", "-trust", "127.0.0.1/32", "-metrics", metrics)
	if err != nil {
		return "", err
	}
	defer ep.Stop()
	cc, err := grpc.NewClient(ep.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer cc.Close()
	p := extprocv3.NewExternalProcessorClient(cc)
	call := func() error {
		_, err := procRequest(context.Background(), p, "127.0.0.1:5000", upstreamWork, "triage-criticality", "CRITICAL")
		return err
	}
	served, err := measure(call, dur, func(ctx context.Context) { a.run(ctx, p) }, func() string { return state(metrics, ep.Pid(), true) })
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("| %s | %s |", a.name, served), nil
}
