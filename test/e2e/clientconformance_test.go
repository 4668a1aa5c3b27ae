package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/throttle"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagehttp"
)

// The client-side conformance table, beside the server one: every row is
// one call made from the same context through a triagegrpc.Client and
// through a triagehttp.Transport whose Callers are configured alike, to a
// plain gRPC server and a plain HTTP server that record the triage keys
// of every attempt and answer from the same script. Both must send the
// same keys, make the same attempts, and end with the same outcome.

// answer is what the servers answer an attempt.
type answer int

const (
	serve      answer = iota // success
	overloaded               // task overloaded: retry elsewhere
	dontRetry                // overloaded; don't retry
	hold                     // wait until the call is cancelled
)

// clientSeen is one transport's result of a row.
type clientSeen struct {
	Attempts [][]string // per attempt, its triage keys as sorted "key=value"
	Outcome  string     // "ok", an outcome token, "canceled" or the error
}

func (s clientSeen) String() string { return fmt.Sprintf("%s after %v", s.Outcome, s.Attempts) }

type clientRow struct {
	name     string
	internal []string             // default: loopback
	policy   func() *retry.Policy // default: none
	sacPol   func() *retry.Policy // with iso
	iso      *isolate.Config      // the table the Caller follows
	ctx      func(context.Context) context.Context
	stale    bool     // the caller's outgoing metadata or headers hold stale triage keys
	answers  []answer // per attempt; the last repeats
	warm     int      // calls answered "overloaded" before the row's, to warm a throttle
	moveTo   *isolate.Config
	want     clientSeen
}

var clientEpoch = time.Unix(1_800_000_000, 0)

func critical(ctx context.Context) context.Context {
	return criticality.NewContext(ctx, criticality.Critical)
}

func bookPolicy(opts ...retry.Option) func() *retry.Policy {
	return func() *retry.Policy {
		p, err := retry.New(append([]retry.Option{retry.WithBackoff(0, 0), retry.WithoutBudget()}, opts...)...)
		if err != nil {
			panic(err)
		}
		return p
	}
}

// alwaysThrottle is a throttle that rejects whenever its probability is
// above zero: deterministic, for the throttling row.
func alwaysThrottle() *retry.Policy {
	th, err := throttle.New(throttle.WithRandom(func() float64 { return 0 }), throttle.WithMinRequests(1))
	if err != nil {
		panic(err)
	}
	return bookPolicy(retry.WithThrottle(th), retry.WithMaxAttempts(1))()
}

var mapsShared = &isolate.Config{Clients: []isolate.Client{{Name: "maps", Hosts: []string{"maps.example"}}}}
var mapsSacrificial = &isolate.Config{Clients: []isolate.Client{{Name: "maps", Hosts: []string{"maps.example"}, Route: "sacrificial"}}}

var clientRows = []clientRow{
	{name: "first try carries no attempt key", ctx: critical, want: clientSeen{
		Attempts: [][]string{{"triage-criticality=CRITICAL"}}, Outcome: "ok"}},
	{name: "an external host gets no triage key", internal: []string{"backend.internal", ".svc.cluster.local"}, stale: true,
		ctx:  func(ctx context.Context) context.Context { return quota.NewContext(critical(ctx), "acme") },
		want: clientSeen{Attempts: [][]string{{}}, Outcome: "ok"}},
	{name: "stale keys of the caller replaced", stale: true, ctx: critical, want: clientSeen{
		Attempts: [][]string{{"triage-criticality=CRITICAL"}}, Outcome: "ok"}},
	{name: "decay and customer", ctx: func(ctx context.Context) context.Context {
		ctx = criticality.NewContext(ctx, criticality.CriticalPlus)
		ctx = criticality.WithDecay(ctx, criticality.Decay{At: clientEpoch.Add(2 * time.Second), To: criticality.Sheddable})
		return quota.NewContext(ctx, "acme")
	}, want: clientSeen{Attempts: [][]string{{"triage-criticality-decay=2000:SHEDDABLE", "triage-criticality=CRITICAL_PLUS", "triage-customer=acme"}}, Outcome: "ok"}},
	{name: "decayed: the level it fell to", ctx: func(ctx context.Context) context.Context {
		ctx = criticality.NewContext(ctx, criticality.CriticalPlus)
		return criticality.WithDecay(ctx, criticality.Decay{At: clientEpoch.Add(-time.Second), To: criticality.SheddablePlus})
	}, want: clientSeen{Attempts: [][]string{{"triage-criticality=SHEDDABLE_PLUS"}}, Outcome: "ok"}},
	{name: "retried after task overloaded", policy: bookPolicy(), ctx: critical, answers: []answer{overloaded, overloaded, serve},
		want: clientSeen{Attempts: [][]string{
			{"triage-criticality=CRITICAL"},
			{"triage-attempt=1", "triage-criticality=CRITICAL"},
			{"triage-attempt=2", "triage-criticality=CRITICAL"}}, Outcome: "ok"}},
	{name: "gives up after three attempts; no criticality is the default", policy: bookPolicy(), answers: []answer{overloaded},
		want: clientSeen{Attempts: [][]string{
			{"triage-criticality=" + criticality.Default.String()},
			{"triage-attempt=1", "triage-criticality=" + criticality.Default.String()},
			{"triage-attempt=2", "triage-criticality=" + criticality.Default.String()}}, Outcome: "overloaded-dont-retry"}},
	{name: "don't retry from the backend is not retried", policy: bookPolicy(), ctx: critical, answers: []answer{dontRetry},
		want: clientSeen{Attempts: [][]string{{"triage-criticality=CRITICAL"}}, Outcome: "overloaded-dont-retry"}},
	{name: "throttled locally", policy: alwaysThrottle, ctx: critical, answers: []answer{overloaded}, warm: 3,
		want: clientSeen{Attempts: nil, Outcome: "overloaded-dont-retry"}},
	{name: "a sacrificial client type has its own policy", policy: bookPolicy(), sacPol: bookPolicy(retry.WithMaxAttempts(1)),
		iso: mapsSacrificial, answers: []answer{overloaded},
		ctx:  func(ctx context.Context) context.Context { return isolate.NewContext(critical(ctx), "maps") },
		want: clientSeen{Attempts: [][]string{{"triage-criticality=CRITICAL"}}, Outcome: "overloaded-dont-retry"}},
	{name: "a route change cancels the client type's calls", policy: bookPolicy(), iso: mapsShared, moveTo: mapsSacrificial,
		answers: []answer{hold},
		ctx:     func(ctx context.Context) context.Context { return isolate.NewContext(critical(ctx), "maps") },
		want:    clientSeen{Attempts: [][]string{{"triage-criticality=CRITICAL"}}, Outcome: "canceled"}},
}

func TestClientConformance(t *testing.T) {
	for _, row := range clientRows {
		t.Run(row.name, func(t *testing.T) {
			g := runClientRow(t, row, grpcCall)
			h := runClientRow(t, row, httpCall)
			if g.String() != row.want.String() {
				t.Errorf("gRPC: %v\nwant  %v", g, row.want)
			}
			if h.String() != row.want.String() {
				t.Errorf("HTTP: %v\nwant  %v", h, row.want)
			}
		})
	}
}

// attemptLog is the servers' shared state: the script, and what every
// attempt carried.
type attemptLog struct {
	mu       sync.Mutex
	answers  []answer
	attempts [][]string
	arrived  chan struct{} // a hold answer has arrived
	n        int
}

func (r *attemptLog) attempt(keys []string) answer {
	r.mu.Lock()
	defer r.mu.Unlock()
	slices.Sort(keys)
	r.attempts = append(r.attempts, keys)
	a := serve
	if len(r.answers) > 0 {
		a = r.answers[min(r.n, len(r.answers)-1)]
	}
	r.n++
	if a == hold {
		close(r.arrived)
	}
	return a
}

func (r *attemptLog) reset(answers []answer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answers, r.attempts, r.n, r.arrived = answers, nil, 0, make(chan struct{})
}

func (r *attemptLog) seen() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts
}

// call makes one call with ctx through a transport bound to caller.
type transportCall func(t *testing.T, rec *attemptLog, caller *egress.Caller) func(ctx context.Context, stale bool) error

func runClientRow(t *testing.T, row clientRow, transport transportCall) clientSeen {
	t.Helper()
	var iso *isolate.Table
	opts := []egress.Option{egress.WithClock(clock.NewFake(clientEpoch)), egress.WithoutPolicy()}
	if row.policy != nil {
		opts = append(opts, egress.WithPolicy(row.policy()))
	}
	if row.iso != nil {
		var err error
		if iso, err = isolate.New(*row.iso); err != nil {
			t.Fatal(err)
		}
		var sac *retry.Policy
		if row.sacPol != nil {
			sac = row.sacPol()
		}
		opts = append(opts, egress.WithIsolation(iso, sac))
	}
	hosts := row.internal
	if hosts == nil {
		hosts = loopback.Hosts
	}
	caller, err := egress.New(append(opts, egress.WithInternal(hosts...))...)
	if err != nil {
		t.Fatal(err)
	}
	defer caller.Close()
	rec := &attemptLog{}
	do := transport(t, rec, caller)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if row.ctx != nil {
		ctx = row.ctx(ctx)
	}
	for range row.warm {
		rec.reset([]answer{overloaded})
		do(ctx, false)
	}
	rec.reset(row.answers)
	if row.moveTo != nil {
		go func() {
			select {
			case <-rec.arrived:
				iso.Set(*row.moveTo)
			case <-ctx.Done():
			}
		}()
	}
	err = do(ctx, row.stale)
	return clientSeen{Attempts: rec.seen(), Outcome: outcomeOf(err)}
}

func outcomeOf(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, context.Canceled), status.Code(err) == codes.Canceled:
		return "canceled"
	}
	if oe, ok := outcome.As(err); ok {
		return oe.Kind.Token()
	}
	return err.Error()
}

func triageKeys(kv map[string][]string) []string {
	keys := []string{}
	for k, vs := range kv {
		k = strings.ToLower(k)
		if strings.HasPrefix(k, "triage-") {
			for _, v := range vs {
				keys = append(keys, k+"="+v)
			}
		}
	}
	return keys
}

// attemptLogService is the plain gRPC server of the table.
type attemptLogService struct {
	testgrpc.UnimplementedTestServiceServer
	rec *attemptLog
}

func (s *attemptLogService) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	switch s.rec.attempt(triageKeys(md)) {
	case overloaded:
		return nil, triagegrpc.Status(outcome.New(outcome.TaskOverloaded, "busy")).Err()
	case dontRetry:
		return nil, triagegrpc.Status(outcome.New(outcome.DontRetry, "busy")).Err()
	case hold:
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &testgrpc.Empty{}, nil
}

func grpcCall(t *testing.T, rec *attemptLog, caller *egress.Caller) func(context.Context, bool) error {
	s := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(s, &attemptLogService{rec: rec})
	client, err := triagegrpc.NewClient(caller)
	if err != nil {
		t.Fatal(err)
	}
	tc := testgrpc.NewTestServiceClient(loopback.DialGRPC(t, loopback.ServeGRPC(t, s), client.DialOptions()...))
	return func(ctx context.Context, stale bool) error {
		if stale {
			ctx = metadata.AppendToOutgoingContext(ctx, "triage-criticality", "CRITICAL_PLUS", "triage-customer", "mallory", "triage-attempt", "2")
		}
		_, err := tc.EmptyCall(ctx, &testgrpc.Empty{})
		return err
	}
}

func httpCall(t *testing.T, rec *attemptLog, caller *egress.Caller) func(context.Context, bool) error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch rec.attempt(triageKeys(r.Header)) {
		case overloaded:
			triagehttp.WriteError(w, outcome.New(outcome.TaskOverloaded, "busy"))
		case dontRetry:
			triagehttp.WriteError(w, outcome.New(outcome.DontRetry, "busy"))
		case hold:
			<-r.Context().Done()
		}
	})}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	hc := &http.Client{Transport: &triagehttp.Transport{Caller: caller}}
	url := "http://" + lis.Addr().String() + "/x"
	return func(ctx context.Context, stale bool) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if stale {
			req.Header.Set("Triage-Criticality", "CRITICAL_PLUS")
			req.Header.Set("Triage-Customer", "mallory")
			req.Header.Set("Triage-Attempt", "2")
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if oe, ok := triagehttp.FromResponse(resp); ok {
			return oe
		}
		return nil
	}
}
