package app

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triagehq/triage/cmd/triage/internal/reflectreq"
	"github.com/triagehq/triage/cmd/triage/internal/report"
	"github.com/triagehq/triage/cmd/triage/internal/tlsfiles"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/loadtest"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagehttp"
)

const loadtestUsage = `Usage:
  triage loadtest -grpc HOST:PORT -method /pkg.Service/Method [-data JSON] [flags]
  triage loadtest -url http://HOST:PORT/PATH [flags]

Tests whether your service keeps its provisioned rate under overload. It
finds the service's capacity C (closed-loop callers, doubled until the rate
of successes stops growing), then offers 0.5x to 10x C on an open loop,
each call with a deadline and a criticality drawn from a mix (sent in
triage's metadata, ignored by services without triage), and prints, and
writes to -out, goodput by criticality, latency percentiles and calls by
outcome: result.json and index.html, a page with the plots that needs no
network. Only loopback targets unless -allow-remote; every run is bounded
in time (-max-duration), rate (-max-rate) and calls in flight.

Flags:
`

type loadtestFlags struct {
	grpcAddr, method, data, dataHex, dataFile string
	tls                                       tlsfiles.Files
	conns                                     int
	rawURL, httpMethod                        string
	header                                    http.Header
	loads, mix, out                           string
	step, deadline, probeStep, maxDuration    time.Duration
	capacity, maxRate                         float64
	probeWorkers, maxInFlight                 int
	allowRemote                               bool
}

func parseLoadtestFlags(args []string, stderr io.Writer) (loadtestFlags, []loadtest.Option, error) {
	var f loadtestFlags
	fs := flag.NewFlagSet("triage loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, loadtestUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&f.grpcAddr, "grpc", "", "gRPC target HOST:PORT")
	fs.StringVar(&f.method, "method", "", `gRPC method, "/package.Service/Method"`)
	fs.StringVar(&f.data, "data", "", "the request: for -grpc, the message in JSON (read through the server's reflection service); for -url, the body")
	fs.StringVar(&f.dataHex, "data-hex", "", "gRPC request message, protobuf wire bytes in hex (default: the empty message)")
	fs.StringVar(&f.dataFile, "data-file", "", "gRPC request message, a file of protobuf wire bytes (protoc --encode); for -url, the request body")
	f.tls.RegisterClient(fs, "", "the target") // any of them: speak TLS (default: plaintext)
	fs.IntVar(&f.conns, "conns", 4, "gRPC connections (calls are spread over them)")
	fs.StringVar(&f.rawURL, "url", "", "HTTP target URL")
	fs.StringVar(&f.httpMethod, "http-method", "GET", "HTTP method")
	f.header = http.Header{}
	fs.Func("header", `an extra HTTP header, "Name: value" (repeatable, as curl's -H)`, func(h string) error {
		k, v, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return fmt.Errorf(`%q is not "Name: value"`, h)
		}
		f.header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
		return nil
	})
	fs.StringVar(&f.loads, "loads", "0.5,1,2,5,10", "load steps, multiples of the capacity")
	fs.StringVar(&f.mix, "mix", "CRITICAL_PLUS:6,CRITICAL:6,SHEDDABLE_PLUS:44,SHEDDABLE:44", "criticality mix, LEVEL:WEIGHT,...")
	fs.DurationVar(&f.step, "step", loadtest.DefaultStep, "length of each load step")
	fs.DurationVar(&f.deadline, "deadline", loadtest.DefaultDeadline, "deadline of each call")
	fs.Float64Var(&f.capacity, "capacity", 0, "the capacity in calls per second (0: probe for it)")
	fs.DurationVar(&f.probeStep, "probe-step", loadtest.DefaultProbeStep, "length of each capacity probe step")
	fs.IntVar(&f.probeWorkers, "probe-callers", loadtest.DefaultProbeWorkers, "most closed-loop callers the probe doubles up to")
	fs.Float64Var(&f.maxRate, "max-rate", loadtest.DefaultMaxRate, "most calls per second ever offered")
	fs.IntVar(&f.maxInFlight, "max-inflight", loadtest.DefaultMaxInFlight, "most calls in flight (beyond: counted not-sent)")
	fs.DurationVar(&f.maxDuration, "max-duration", loadtest.DefaultMaxDuration, "refuse a run planned to last longer")
	fs.StringVar(&f.out, "out", "loadtest-out", "directory for result.json, the figures and index.html (empty: write nothing)")
	fs.BoolVar(&f.allowRemote, "allow-remote", false, "allow a target that is not a loopback address")
	if err := fs.Parse(args); err != nil {
		return f, nil, err
	}
	if fs.NArg() > 0 {
		return f, nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if (f.grpcAddr == "") == (f.rawURL == "") {
		return f, nil, errors.New("name one target: -grpc HOST:PORT (with -method) or -url URL")
	}
	if f.grpcAddr != "" && f.method == "" {
		return f, nil, errors.New(`-grpc needs -method "/package.Service/Method"`)
	}
	if f.conns < 1 || f.conns > 64 {
		return f, nil, fmt.Errorf("-conns %d must be between 1 and 64", f.conns)
	}
	var loads []float64
	for _, s := range strings.Split(f.loads, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return f, nil, fmt.Errorf("-loads: %q is not a number", s)
		}
		loads = append(loads, v)
	}
	mix, err := loadtest.ParseMix(f.mix)
	if err != nil {
		return f, nil, fmt.Errorf("-mix: %w", err)
	}
	opts := []loadtest.Option{loadtest.WithLoads(loads...), loadtest.WithMix(mix), loadtest.WithStep(f.step),
		loadtest.WithDeadline(f.deadline), loadtest.WithCapacity(f.capacity), loadtest.WithProbe(f.probeStep, f.probeWorkers),
		loadtest.WithMaxRate(f.maxRate), loadtest.WithMaxInFlight(f.maxInFlight), loadtest.WithMaxDuration(f.maxDuration)}
	return f, opts, nil
}

// target builds the Target the flags name; close releases it.
func (f loadtestFlags) target(ctx context.Context) (t loadtest.Target, name string, close func(), err error) {
	host := f.grpcAddr
	if f.rawURL != "" {
		u, err := url.Parse(f.rawURL)
		if err != nil {
			return nil, "", nil, fmt.Errorf("-url: %w", err)
		}
		host = u.Host
	}
	if !f.allowRemote {
		if err := loadtest.CheckLoopback(ctx, host); err != nil {
			return nil, "", nil, fmt.Errorf("%w (-allow-remote to test it anyway)", err)
		}
	}
	tlsConf, err := f.tlsConfig()
	if err != nil {
		return nil, "", nil, err
	}
	data, err := f.body()
	if err != nil {
		return nil, "", nil, err
	}
	if f.rawURL != "" {
		return f.httpTarget(host, tlsConf, data)
	}
	return f.grpcTarget(ctx, tlsConf, data)
}

// tlsConfig is the client TLS of -tls-ca, -tls-cert and -tls-key (a
// client certificate, for a target that authenticates its callers), nil
// without any of them.
func (f loadtestFlags) tlsConfig() (*tls.Config, error) {
	if !f.tls.Set() {
		return nil, nil
	}
	c, err := f.tls.Client()
	if err != nil {
		return nil, fmt.Errorf("-tls-ca, -tls-cert, -tls-key: %w", err)
	}
	return c, nil
}

// body is the request's message of -data (HTTP only: gRPC's is encoded
// by reflection once connected), -data-hex (gRPC only) or -data-file.
func (f loadtestFlags) body() ([]byte, error) {
	given := 0
	for _, d := range []string{f.data, f.dataHex, f.dataFile} {
		if d != "" {
			given++
		}
	}
	switch {
	case given > 1:
		return nil, errors.New("give one of -data, -data-hex and -data-file")
	case f.dataHex != "" && f.rawURL != "":
		return nil, errors.New("-data-hex is for gRPC; give an HTTP body with -data-file")
	case f.data != "" && f.rawURL != "":
		return []byte(f.data), nil
	case f.dataFile != "":
		data, err := os.ReadFile(f.dataFile)
		if err != nil {
			return nil, fmt.Errorf("-data-file: %w", err)
		}
		return data, nil
	case f.dataHex != "":
		data, err := hex.DecodeString(f.dataHex)
		if err != nil {
			return nil, fmt.Errorf("-data-hex: %w", err)
		}
		return data, nil
	}
	return nil, nil
}

// httpTarget is the Target of -url.
func (f loadtestFlags) httpTarget(host string, tlsConf *tls.Config, data []byte) (loadtest.Target, string, func(), error) {
	header := f.header
	base := http.DefaultTransport.(*http.Transport).Clone()
	// A connection per call in flight, kept: a load test's clients close
	// one only when a call's deadline passes, not because their pool is
	// full (MaxIdleConns 100, MaxIdleConnsPerHost 2 by default).
	base.MaxIdleConns = f.maxInFlight
	base.MaxIdleConnsPerHost = f.maxInFlight
	base.TLSClientConfig = tlsConf
	caller, err := egress.New(egress.WithoutPolicy(), egress.WithInternal(host))
	if err != nil {
		return nil, "", nil, err
	}
	client := &http.Client{Transport: &triagehttp.Transport{Base: base, Caller: caller}}
	t, err := triagehttp.NewLoadTarget(client, f.httpMethod, f.rawURL, data, header)
	if err != nil {
		return nil, "", nil, err
	}
	return t, f.httpMethod + " " + f.rawURL, base.CloseIdleConnections, nil
}

// grpcTarget is the Target of -grpc: -conns connections, called in turn.
func (f loadtestFlags) grpcTarget(ctx context.Context, tlsConf *tls.Config, data []byte) (loadtest.Target, string, func(), error) {
	creds := insecure.NewCredentials()
	if tlsConf != nil {
		creds = credentials.NewTLS(tlsConf)
	}
	// The target is the operator's own server: every host is internal.
	caller, err := egress.New(egress.WithoutPolicy(), egress.WithInternal("*"))
	if err != nil {
		return nil, "", nil, err
	}
	client, err := triagegrpc.NewClient(caller)
	if err != nil {
		return nil, "", nil, err
	}
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, client.DialOptions()...)
	var conns []*grpc.ClientConn
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	var targets []loadtest.Target
	for range f.conns {
		cc, err := grpc.NewClient("passthrough:///"+f.grpcAddr, dial...)
		if err != nil {
			closeAll()
			return nil, "", nil, fmt.Errorf("-grpc: %w", err)
		}
		conns = append(conns, cc)
		if f.data != "" && data == nil {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			data, err = reflectreq.Encode(rctx, cc, f.method, f.data)
			cancel()
			if err != nil {
				closeAll()
				return nil, "", nil, fmt.Errorf("-data: %w", err)
			}
		}
		t, err := triagegrpc.NewLoadTarget(cc, f.method, data)
		if err != nil {
			closeAll()
			return nil, "", nil, err
		}
		targets = append(targets, t)
	}
	return roundRobin(targets), f.grpcAddr + f.method, closeAll, nil
}

// roundRobin spreads calls over targets (one per connection).
func roundRobin(ts []loadtest.Target) loadtest.Target {
	var next atomic.Uint64
	return loadtest.TargetFunc(func(ctx context.Context) loadtest.Outcome {
		return ts[next.Add(1)%uint64(len(ts))].Call(ctx)
	})
}

func runLoadtest(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, opts, err := parseLoadtestFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "triage loadtest: %v\n", err)
		return 2
	}
	t, name, closeTarget, err := f.target(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "triage loadtest: %v\n", err)
		return 2
	}
	defer closeTarget()
	opts = append(opts, loadtest.WithProgress(func(line string) { fmt.Fprintln(stderr, line) }))
	r, err := loadtest.New(t, opts...)
	if err != nil {
		fmt.Fprintf(stderr, "triage loadtest: %v\n", err)
		return 2
	}
	res, err := r.Run(ctx)
	if res != nil {
		res.Target = name
	}
	if err != nil && (res == nil || len(res.Steps) == 0) {
		fmt.Fprintf(stderr, "triage loadtest: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: capacity C = %.0f calls/s (%s), deadline %v\n\n", name, res.Capacity, map[bool]string{true: "probed", false: "given"}[res.CapacityProbed], f.deadline)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, row := range res.Table() {
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
	if cerr := res.Check(); cerr != nil {
		fmt.Fprintf(stderr, "triage loadtest: %v\n", cerr)
		return 1
	}
	if f.out != "" {
		files, werr := report.WriteLoadtest(f.out, res)
		if werr != nil {
			fmt.Fprintf(stderr, "triage loadtest: %v\n", werr)
			return 1
		}
		fmt.Fprintf(stdout, "\nwrote %s\n", strings.Join(files, ", "))
	}
	if err != nil {
		fmt.Fprintf(stderr, "triage loadtest: stopped early: %v\n", err)
		return 1
	}
	return 0
}
