// Package demo is the first version of `triage demo`: a stack on loopback
// sockets (an HTTP frontend, then gRPC backend A, then gRPC backend B, the
// book's Figure 21-2 without its last tier) that shows criticality set at
// the edge by rules, propagated through two RPC hops, overridden in the
// middle, spoofing from an untrusted client ignored, and the overload
// outcomes travelling back up.
package demo

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/internal/loopback"
	"github.com/triagehq/triage/internal/relay"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/triageprom"
	"github.com/triagehq/triage/triageyaml"
	"github.com/triagehq/triage/trust"
)

// DefaultConfig is the frontend's edge configuration when none is given.
const DefaultConfig = `# Who may set triage headers, and how the frontend assigns criticality.
trust:
  networks: ["127.0.0.2/32"]     # the internal proxy; browsers come from elsewhere
criticality:
  default: CRITICAL
  rules:
    - header: true               # believed only from trusted peers
    - host: batch.example.com    # each client type on its own hostname
      criticality: SHEDDABLE
    - path_prefix: /checkout
      criticality: CRITICAL_PLUS
    - path_prefix: /suggest
      criticality: SHEDDABLE_PLUS
`

// Addresses on the loopback network the demo's clients dial from.
const (
	internalIP = "127.0.0.1" // the services themselves
	proxyIP    = "127.0.0.2" // a trusted internal proxy
	browserIP  = "127.0.0.3" // the outside world
)

// Options configure a run.
type Options struct {
	// Requests is how many requests each client scenario sends. Zero: 25.
	Requests int
	// Config is the frontend's edge configuration (YAML). Empty: DefaultConfig.
	Config []byte
	// Timeout bounds each request. Zero: 5s.
	Timeout time.Duration
}

// Scenario is one kind of request the demo sends.
type Scenario struct {
	Name   string
	Client string // "browser" (untrusted) or "proxy" (trusted)
	Host   string
	Path   string
	Body   string
	Header string // a Triage-Criticality header to send, "" for none
}

// Scenarios are the demo's requests, in order.
var Scenarios = []Scenario{
	{"home page", "browser", "www.example.com", "/", "page", ""},
	{"checkout", "browser", "www.example.com", "/checkout/pay", "page", ""},
	{"search suggestions", "browser", "www.example.com", "/suggest", "page", ""},
	{"batch upload (own hostname)", "browser", "batch.example.com", "/upload", "page", ""},
	{"spoofed CRITICAL_PLUS header", "browser", "batch.example.com", "/upload", "page", "CRITICAL_PLUS"},
	{"trusted proxy sets SHEDDABLE", "proxy", "www.example.com", "/checkout", "page", "SHEDDABLE"},
	{"A overrides: prefetch is SHEDDABLE", "browser", "www.example.com", "/checkout", "prefetch", ""},
	{"B out of quota -> 429", "browser", "www.example.com", "/", "quota", ""},
	{"B task overloaded -> A: don't retry", "browser", "www.example.com", "/", "overload", ""},
}

// Row is what one scenario produced.
type Row struct {
	Scenario Scenario
	Sent     int
	Status   map[int]int    // HTTP status -> count
	Outcome  map[string]int // Triage-Outcome header -> count
	Arrived  map[string]int // "tier:LEVEL/attempt" -> count
	Trace    string         // one successful trace
	Errors   int            // transport errors
}

// Result is a whole run.
type Result struct {
	Rows    []Row
	Metrics map[string]float64 // selected triage_* series
}

// Run starts the stack, sends the scenarios, prints what each tier saw to
// w, and stops everything it started. It honours ctx.
func Run(ctx context.Context, w io.Writer, o Options) (*Result, error) {
	if o.Requests <= 0 {
		o.Requests = 25
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if len(o.Config) == 0 {
		o.Config = []byte(DefaultConfig)
	}
	cfg, err := triageyaml.ParseEdge(o.Config)
	if err != nil {
		return nil, err
	}
	metrics := triageprom.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)
	pol, rules, err := cfg.Build(edge.WithObserver(metrics))
	if err != nil {
		return nil, err
	}
	st, err := start(pol, rules)
	if err != nil {
		return nil, err
	}
	defer st.stop()

	fmt.Fprintf(w, "triage demo: HTTP frontend %s -> gRPC backend A %s -> gRPC backend B %s (all loopback)\n", st.httpURL, st.aAddr, st.bAddr)
	fmt.Fprintf(w, "Clients dial from %s (a trusted proxy) and %s (browsers, untrusted). %d requests per scenario.\n\n", proxyIP, browserIP, o.Requests)

	clients := map[string]*http.Client{
		"browser": loopback.HTTPClient(browserIP, o.Timeout),
		"proxy":   loopback.HTTPClient(proxyIP, o.Timeout),
	}
	res := &Result{}
	for _, sc := range Scenarios {
		row := Row{Scenario: sc, Status: map[int]int{}, Outcome: map[string]int{}, Arrived: map[string]int{}}
		before := st.arrivals()
		for i := 0; i < o.Requests; i++ {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			status, oc, body, err := send(ctx, clients[sc.Client], st.httpURL, sc)
			row.Sent++
			if err != nil {
				row.Errors++
				continue
			}
			row.Status[status]++
			if oc != "" {
				row.Outcome[oc]++
			}
			if status == http.StatusOK && row.Trace == "" {
				row.Trace = body
			}
		}
		for k, v := range st.arrivals() {
			if d := v - before[k]; d > 0 {
				row.Arrived[k] = d
			}
		}
		res.Rows = append(res.Rows, row)
	}
	res.Metrics = gather(reg)
	print(w, res)
	return res, nil
}

type stack struct {
	aAddr   string
	bAddr   string
	httpURL string
	closers []func()

	mu      sync.Mutex
	arrived map[string]int // "tier:LEVEL/attempt" -> count; at most 3 tiers x 4 x 4 keys
}

func (s *stack) stop() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

func (s *stack) observe(a relay.Arrival) {
	s.mu.Lock()
	s.arrived[a.String()]++
	s.mu.Unlock()
}

func (s *stack) arrivals() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.arrived))
	for k, v := range s.arrived {
		out[k] = v
	}
	return out
}

// failByBody makes backend B answer with an overload outcome for the
// scenarios that ask for one.
func failByBody(_ context.Context, body string) error {
	switch body {
	case "overload":
		return outcome.New(outcome.TaskOverloaded, "demo")
	case "quota":
		return &outcome.Error{Kind: outcome.OutOfQuota, RetryAfter: 30 * time.Second, Reason: "demo customer"}
	}
	return nil
}

func listen() (net.Listener, error) { return net.Listen("tcp", internalIP+":0") }

func start(pol *trust.Policy, rules *edge.Classifier) (st *stack, err error) {
	st = &stack{arrived: map[string]int{}}
	defer func() {
		if err != nil {
			st.stop()
		}
	}()
	// Internal tiers trust each other by network.
	internal, err := trust.New(trust.Config{Networks: []string{internalIP + "/32"}})
	if err != nil {
		return nil, err
	}
	srv, err := triagegrpc.NewServer(triagegrpc.WithTrust(internal))
	if err != nil {
		return nil, err
	}
	// One Client per backend service: its throttle and retry budget keep
	// that service's statistics. The random sources are seeded so that a
	// run is repeatable.
	var seq uint64
	newClient := func() (*triagegrpc.Client, error) {
		seq++
		var mu sync.Mutex
		rng := rand.New(rand.NewPCG(1, seq))
		p, err := retry.New(retry.WithRandom(func() float64 {
			mu.Lock()
			defer mu.Unlock()
			return rng.Float64()
		}))
		if err != nil {
			return nil, err
		}
		return triagegrpc.NewClient(triagegrpc.WithPolicy(p)), nil
	}
	serve := func(t *relay.Tier) (string, error) {
		lis, err := listen()
		if err != nil {
			return "", err
		}
		s := grpc.NewServer(srv.ServerOptions()...)
		relay.Register(s, t)
		go s.Serve(lis)
		st.closers = append(st.closers, s.Stop)
		return lis.Addr().String(), nil
	}
	dial := func(addr string) (*grpc.ClientConn, error) {
		client, err := newClient()
		if err != nil {
			return nil, err
		}
		cc, err := grpc.NewClient("passthrough:///"+addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, client.DialOptions()...)...)
		if err == nil {
			st.closers = append(st.closers, func() { cc.Close() })
		}
		return cc, err
	}

	b := &relay.Tier{Name: "B", Fail: failByBody, Observe: st.observe}
	if st.bAddr, err = serve(b); err != nil {
		return nil, err
	}
	toB, err := dial(st.bAddr)
	if err != nil {
		return nil, err
	}
	a := &relay.Tier{Name: "A", Next: toB, Observe: st.observe,
		Override: func(ctx context.Context, body string) context.Context {
			if body == "prefetch" {
				return criticality.NewContext(ctx, criticality.Sheddable)
			}
			return ctx
		}}
	if st.aAddr, err = serve(a); err != nil {
		return nil, err
	}
	toA, err := dial(st.aAddr)
	if err != nil {
		return nil, err
	}

	mw, err := triagehttp.Middleware(triagehttp.WithTrust(pol), triagehttp.WithClassifier(rules))
	if err != nil {
		return nil, err
	}
	front := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st.observe(relay.Arrival{Tier: "front", Criticality: criticality.Of(r.Context())})
		resp, err := relay.Invoke(r.Context(), toA, r.URL.Query().Get("body"))
		if err != nil {
			if !triagehttp.WriteError(w, err) {
				http.Error(w, err.Error(), http.StatusBadGateway)
			}
			return
		}
		fmt.Fprintf(w, "front:%v > %s", criticality.Of(r.Context()), resp)
	})
	lis, err := listen()
	if err != nil {
		return nil, err
	}
	hs := &http.Server{Handler: mw(front), ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(lis)
	st.closers = append(st.closers, func() { hs.Close() })
	st.httpURL = "http://" + lis.Addr().String()
	return st, nil
}

func send(ctx context.Context, c *http.Client, base string, sc Scenario) (status int, oc, body string, err error) {
	req, err := http.NewRequestWithContext(ctx, "GET", base+sc.Path+"?body="+url.QueryEscape(sc.Body), nil)
	if err != nil {
		return 0, "", "", err
	}
	req.Host = sc.Host
	if sc.Header != "" {
		req.Header.Set("Triage-Criticality", sc.Header)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return 0, "", "", err
	}
	return resp.StatusCode, resp.Header.Get("Triage-Outcome"), strings.TrimSpace(string(b)), nil
}

func gather(reg *prometheus.Registry) map[string]float64 {
	out := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue()
			if v == 0 {
				continue
			}
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	return out
}

func keys[M ~map[K]V, K comparable, V any](m M, less func(a, b K) bool) []K {
	ks := make([]K, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return less(ks[i], ks[j]) })
	return ks
}

func print(w io.Writer, res *Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tCLIENT\tSENT\tHTTP\tWHAT EACH TIER SAW (tier:criticality/attempt x count)")
	for _, r := range res.Rows {
		var status []string
		for _, code := range keys(r.Status, func(a, b int) bool { return a < b }) {
			status = append(status, fmt.Sprintf("%d x%d", code, r.Status[code]))
		}
		for _, oc := range keys(r.Outcome, func(a, b string) bool { return a < b }) {
			status = append(status, oc)
		}
		if r.Errors > 0 {
			status = append(status, fmt.Sprintf("errors x%d", r.Errors))
		}
		var seen []string
		order := map[string]int{"front": 0, "A": 1, "B": 2}
		for _, k := range keys(r.Arrived, func(a, b string) bool {
			ta, _, _ := strings.Cut(a, ":")
			tb, _, _ := strings.Cut(b, ":")
			if order[ta] != order[tb] {
				return order[ta] < order[tb]
			}
			return a < b
		}) {
			seen = append(seen, fmt.Sprintf("%s x%d", k, r.Arrived[k]))
		}
		hdr := ""
		if r.Scenario.Header != "" {
			hdr = " [sends " + r.Scenario.Header + "]"
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%d\t%s\t%s\n", r.Scenario.Name, hdr, r.Scenario.Client, r.Sent, strings.Join(status, ", "), strings.Join(seen, "  "))
	}
	tw.Flush()
	fmt.Fprintln(w, "\nMetrics (triageprom, non-zero series):")
	for _, k := range keys(res.Metrics, func(a, b string) bool { return a < b }) {
		fmt.Fprintf(w, "  %s %v\n", k, res.Metrics[k])
	}
	fmt.Fprintln(w, "\nRead it as: the frontend sets criticality by rules (host, path); backends A and B see it unchanged,")
	fmt.Fprintln(w, "except where A overrides it for its own call (prefetch). The browser's spoofed header was stripped,")
	fmt.Fprintln(w, "the trusted proxy's was believed. B's \"task overloaded\" reached the browser as \"overloaded; don't retry\":")
	fmt.Fprintln(w, "only the layer directly above a rejecting layer may retry.")
}
