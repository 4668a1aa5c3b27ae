package app

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/signals"
	"github.com/triagehq/triage/triagegrpc/batchproxy"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/triagehq/triage/cmd/triage/internal/tlsfiles"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/shadow"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/triagesidecar"
)

// egressRoute is one -egress flag: a loopback listener for the service's
// calls to one upstream.
type egressRoute struct {
	listen string
	up     *url.URL
}

// sidecarFlags are triage sidecar's flags, parsed and checked.
type sidecarFlags struct {
	listen, metrics     string
	readyPath, livePath string
	upstreamReady       string       // the upstream's own readiness path, or ""
	upstreamLoad        bool         // shed by the load the upstream reports
	ready               http.Handler // the readiness handler build makes
	up                  *url.URL
	egress              []egressRoute
	edge                edgeFlags
	admission           admissionFlags
	unauthed            bool
	insecureEgress      bool
	egressInternal      []string // -egress-internal patterns; none: clusterInternal decides
	drain, timeout      time.Duration
	bodyTimeout         time.Duration // -body-timeout
	bodyMinRate         int
	tls, upstreamTLS    tlsfiles.Files
	log                 logFlags
	quietSysmon         bool // -quiet-sysmon, read by Main (sysmonEnv)
}

// parseSidecarFlags parses args, writing usage and errors to stderr; the
// int is the exit status when it fails (0 for -help).
func parseSidecarFlags(args []string, stderr io.Writer, o *options) (*sidecarFlags, int, bool) {
	fs := flag.NewFlagSet("triage sidecar", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &sidecarFlags{}
	fs.StringVar(&f.listen, "listen", "127.0.0.1:7090", "address callers reach the service on (HTTP/1.1, HTTP/2 and gRPC; h2c without TLS)")
	upstream := fs.String("upstream", "", "the service behind the sidecar: http://HOST:PORT (HTTP/1.1), h2c://HOST:PORT (cleartext HTTP/2, gRPC) or https://HOST:PORT; required")
	fs.Func("egress", "LISTEN=URL: a loopback listener for the service's own calls to URL, with the client side (throttling, retry budget, attempts); repeatable", func(v string) error {
		r, err := parseEgressRoute(v)
		f.egress = append(f.egress, r)
		return err
	})
	f.edge.register(fs)
	f.tls.RegisterServer(fs, "", "callers")
	f.upstreamTLS.RegisterClient(fs, "upstream-", "the upstream")
	fs.BoolVar(&f.unauthed, "unauthenticated", false, "serve callers without verified client certificates beyond loopback")
	fs.Func("egress-internal", "a host pattern whose -egress upstreams receive triage's headers (criticality, customer, attempt, decay): a name, \".suffix\" or *; repeatable. Default: cluster-internal hosts only (one-label names, .svc, .cluster.local, .internal, .local, localhost, loopback and private addresses)", func(v string) error {
		if strings.TrimSpace(v) == "" {
			return errors.New("empty pattern")
		}
		f.egressInternal = append(f.egressInternal, v)
		return nil
	})
	fs.BoolVar(&f.insecureEgress, "insecure-egress", false, "let -egress call http:// upstreams beyond loopback (the calls and their triage headers in the clear)")
	f.admission.register(fs, batchproxy.DefaultMaxWait)
	fs.DurationVar(&f.timeout, "timeout", 0, "deadline of a request that comes without one (gRPC's grpc-timeout is honoured); 0: none")
	fs.DurationVar(&f.bodyTimeout, "body-timeout", triagehttp.DefaultBodyTimeout, "how long the sidecar reads a request's body ahead (its first 64 KiB, before it is let through), plus a second for every -body-min-rate bytes that came; a body that stops is answered 408")
	fs.IntVar(&f.bodyMinRate, "body-min-rate", triagehttp.DefaultBodyMinRate, "bytes a second a body must keep coming at to be read past -body-timeout (0: -body-timeout in all)")
	fs.DurationVar(&f.drain, "drain", 2*time.Second, "on SIGTERM, how long the sidecar answers readiness 503 (lame duck) before it stops; requests still running 10 s later are cut")
	fs.StringVar(&f.readyPath, "ready-path", triagehttp.ReadyPath, "readiness probe, answered by the sidecar on -listen and -metrics (503 in lame duck)")
	fs.StringVar(&f.livePath, "live-path", triagehttp.LivePath, "liveness probe, answered by the sidecar on -listen and -metrics")
	fs.StringVar(&f.upstreamReady, "upstream-ready", "", "the upstream's own readiness path (e.g. /healthz): the sidecar's readiness answers 503 while the upstream does not answer it 2xx or 3xx within a second (asked at most once a second); default: the sidecar's readiness does not ask the upstream")
	fs.BoolVar(&f.upstreamLoad, "upstream-load", false, "shed by the load the upstream reports in its answers, ORCA's endpoint-load-metrics (TEXT, JSON or BIN) or endpoint-load-metrics-bin header or gRPC trailer: its application utilization, else its CPU's, against admission's thresholds (SHEDDABLE from 0.8, CRITICAL_PLUS from 0.95); a report counts for "+triagesidecar.DefaultUpstreamLoadAge.String()+". Only for a report that passes 1 when the service is past its capacity, not one that is 1 whenever it is busy (docs/sidecar.md)")
	fs.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9092); default none")
	fs.BoolVar(&f.quietSysmon, "quiet-sysmon", true, "run with GODEBUG="+quietSysmon+" (unless GODEBUG sets schedtrace): Go's sysmon thread then does not wake with each request after an idle moment, which on a CPU shared with the service took a fifth to a quarter of the sidecar's CPU (docs/sidecar.md)")
	f.log.register(fs)
	if code, ok := o.parse(fs, args, stderr, &f.tls); !ok {
		return nil, code, false
	}
	if msg := f.check(fs, *upstream); msg != "" {
		fmt.Fprintln(stderr, "triage sidecar: "+msg)
		return nil, 2, false
	}
	if err := f.edge.build(); err != nil {
		fmt.Fprintf(stderr, "triage sidecar: %v\n", err)
		return nil, 2, false
	}
	return f, 0, true
}

// parseEgressRoute parses LISTEN=URL.
func parseEgressRoute(v string) (egressRoute, error) {
	listen, raw, ok := strings.Cut(v, "=")
	if !ok {
		return egressRoute{}, errors.New("want LISTEN=URL, e.g. 127.0.0.1:7091=http://orders.internal:8080")
	}
	if _, _, err := net.SplitHostPort(listen); err != nil {
		return egressRoute{}, err
	}
	if beyondLoopback(listen) {
		return egressRoute{}, fmt.Errorf("%s is beyond loopback: an egress listener trusts its callers' headers, so it listens only on loopback", listen)
	}
	u, err := parseUpstream(raw)
	return egressRoute{listen: listen, up: u}, err
}

// parseUpstream parses an upstream URL: a scheme the sidecar speaks, a
// host and port.
func parseUpstream(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return nil, err
	case u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "h2c":
		return nil, fmt.Errorf("upstream %q: the scheme must be http, https or h2c", raw)
	case u.Port() == "" || u.Hostname() == "":
		return nil, fmt.Errorf("upstream %q: want SCHEME://HOST:PORT", raw)
	}
	return u, nil
}

// check returns what is wrong with the flags, or "".
func (f *sidecarFlags) check(fs *flag.FlagSet, upstream string) string {
	var err error
	if msg := f.admission.check(); msg != "" {
		return msg
	}
	if msg := checkServing(f.listen, f.tls, f.unauthed, f.edge.identities); msg != "" {
		return msg
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Sprintf("unexpected argument %q", fs.Arg(0))
	case upstream == "":
		return "-upstream is required"
	case f.drain < 0 || f.drain > time.Hour || f.timeout < 0:
		return "-drain must be between 0 and 1h, -timeout at least 0"
	case f.bodyTimeout <= 0 || f.bodyMinRate < 0:
		return "-body-timeout must be positive, -body-min-rate at least 0"
	case !strings.HasPrefix(f.readyPath, "/") || !strings.HasPrefix(f.livePath, "/") || f.readyPath == f.livePath:
		return "-ready-path and -live-path must be two different paths starting with /"
	}
	if f.up, err = parseUpstream(upstream); err != nil {
		return err.Error()
	}
	if f.up.Scheme != "https" && beyondLoopback(f.up.Host) {
		return fmt.Sprintf("upstream %s is beyond loopback in the clear: a sidecar's upstream is its own service, on loopback; use https:// and the -upstream-tls flags otherwise", f.up.Host)
	}
	https := f.up.Scheme == "https"
	for _, r := range f.egress {
		https = https || r.up.Scheme == "https"
		if r.up.Scheme != "https" && beyondLoopback(r.up.Host) && !f.insecureEgress {
			return fmt.Sprintf("egress upstream %s is beyond loopback in the clear: use https:// (the -upstream-tls flags apply), or -insecure-egress", r.up.Host)
		}
	}
	if f.upstreamTLS.Set() && !https {
		return "the -upstream-tls flags need an https upstream (-upstream or -egress)"
	}
	return ""
}

// checkServing returns what is wrong with serving on listen with the
// TLS files, or "": beyond loopback, callers must be authenticated
// (-tls-client-ca) unless -unauthenticated says otherwise.
func checkServing(listen string, files tlsfiles.Files, unauthed bool, identities string) string {
	switch {
	case files.CA != "" && unauthed:
		return "-unauthenticated and -tls-client-ca contradict each other"
	case files.CA == "" && !unauthed && beyondLoopback(listen):
		return fmt.Sprintf("-listen %s is beyond loopback: give -tls-cert, -tls-key and -tls-client-ca so that callers are authenticated, or -unauthenticated", listen)
	case identities != "" && files.CA == "":
		return "-trust-identity needs -tls-client-ca (identities come from client certificates it verified)"
	}
	return ""
}

// runSidecar serves the sidecar until ctx is done, then drains in lame
// duck and stops: the ingress listener in front of -upstream, and one
// loopback listener per -egress.
func runSidecar(ctx context.Context, args []string, stdout, stderr io.Writer, o *options) int {
	f, code, ok := parseSidecarFlags(args, stderr, o)
	if !ok {
		return code
	}
	sv, code := o.startServing(ctx, "sidecar", &f.log, stderr)
	if sv == nil {
		return code
	}
	defer sv.stop()
	log, reg, m := sv.log, sv.reg, sv.obs
	servers, lc, err := f.build(m, reg)
	if err != nil {
		log.Error("sidecar cannot start", "err", err)
		return 1
	}
	if err := f.edge.watch(ctx, log); err != nil {
		log.Error("sidecar cannot watch its configuration", "err", err)
		return 1
	}
	if f.metrics != "" {
		stopMetrics, err := serveMetrics(f.metrics, reg, lc, probes{f.readyPath, f.livePath, f.ready})
		if err != nil {
			log.Error("sidecar cannot serve metrics", "addr", f.metrics, "err", err)
			return 1
		}
		defer stopMetrics()
	}
	return f.serve(ctx, servers, lc, log, stdout)
}

// listener is one of the sidecar's servers and its address.
type listener struct {
	addr string
	srv  *http.Server
	tls  bool
}

// serve listens on every address, serves until ctx is done, then shuts
// down through lc.
func (f *sidecarFlags) serve(ctx context.Context, servers []listener, lc *lifecycle.Lifecycle, log *slog.Logger, stdout io.Writer) int {
	var lis []net.Listener
	for _, s := range servers {
		l, err := net.Listen("tcp", s.addr)
		if err != nil {
			for _, l := range lis {
				l.Close()
			}
			log.Error("sidecar cannot listen", "addr", s.addr, "err", err)
			return 1
		}
		lis = append(lis, l)
	}
	errc := make(chan error, len(servers))
	for i, s := range servers {
		go func() {
			if s.tls {
				errc <- s.srv.ServeTLS(lis[i], "", "")
			} else {
				errc <- s.srv.Serve(lis[i])
			}
		}()
	}
	fmt.Fprintf(stdout, "sidecar listening on %s for %s; readiness %s, liveness %s\n", lis[0].Addr(), f.up, f.readyPath, f.livePath)
	for i, r := range f.egress {
		fmt.Fprintf(stdout, "egress listening on %s for %s\n", lis[i+1].Addr(), r.up)
	}
	select {
	case err := <-errc:
		log.Error("sidecar stopped", "err", err)
		return 1
	case <-ctx.Done():
	}
	log.Info("lame duck, then stop", "drain", f.drain)
	sctx, cancel := context.WithTimeout(context.Background(), f.drain+10*time.Second)
	defer cancel()
	lc.Shutdown(sctx, func(ctx context.Context) error {
		for _, s := range servers {
			triagehttp.Shutdown(s.srv)(ctx)
		}
		return nil
	})
	log.Info("stopped")
	return 0
}

// build makes the ingress server and the egress servers.
func (f *sidecarFlags) build(m *observers, reg *prometheus.Registry) ([]listener, *lifecycle.Lifecycle, error) {
	lc, err := lifecycle.New(lifecycle.WithDrain(f.drain))
	if err != nil {
		return nil, nil, err
	}
	mw := []triagehttp.Option{triagehttp.WithIntake(intake.WithTrust(f.edge.trust), intake.WithClassifier(f.edge.classifier)), triagehttp.WithLifecycle(lc),
		triagehttp.WithBodyTimeout(f.bodyTimeout, f.bodyMinRate), triagehttp.WithIntake(append(m.intake(), intake.WithPeerShare(f.admission.peerShare))...)}
	var load *signals.Reported
	var extra []admission.Option
	if f.upstreamLoad && !f.admission.off {
		if load, err = signals.NewReported("upstream", triagesidecar.DefaultUpstreamLoadAge, nil); err != nil {
			return nil, nil, err
		}
		extra = append(extra, admission.WithSignal(load, admission.DefaultThresholds()))
	}
	ctl, err := f.admission.controller(m, reg, extra...)
	if err != nil {
		return nil, nil, err
	}
	if ctl != nil {
		mw = append(mw, triagehttp.WithAdmission(ctl))
	}
	if f.admission.shadow {
		mw = append(mw, triagehttp.WithIntake(intake.WithShadow(shadow.All(), m.Shadow())))
	}
	rt, err := f.transport(f.up)
	if err != nil {
		return nil, nil, err
	}
	if len(f.edge.healthChecks) > 0 {
		mw = append(mw, triagehttp.WithHealthCheck(f.edge.healthChecks...))
	}
	if name := f.edge.groupHeader; name != "" {
		mw = append(mw, triagehttp.WithGroup(func(r *http.Request) string { return r.Header.Get(name) }))
	}
	in, err := triagesidecar.Ingress(f.up, triagesidecar.WithTransport(rt), triagesidecar.WithTimeout(f.timeout), triagesidecar.WithMiddleware(mw...),
		triagesidecar.WithUpstreamLoad(load))
	if err != nil {
		return nil, nil, err
	}
	var probe *triagesidecar.UpstreamProbe
	if f.upstreamReady != "" {
		if probe, err = triagesidecar.NewUpstreamProbe(f.up, f.upstreamReady, rt, time.Second, nil); err != nil {
			return nil, nil, err
		}
	}
	f.ready = triagesidecar.ReadyHandler(lc, probe)
	mux := http.NewServeMux()
	mux.Handle(f.readyPath, f.ready)
	mux.Handle(f.livePath, triagehttp.LivenessHandler())
	mux.Handle("/", m.http(in))
	ingress, err := f.server(mux, f.tls)
	if err != nil {
		return nil, nil, err
	}
	triagehttp.Announce(lc, ingress)
	servers := []listener{{addr: f.listen, srv: ingress, tls: f.tls.Set()}}
	for _, r := range f.egress {
		s, err := f.egressServer(r, m)
		if err != nil {
			return nil, nil, err
		}
		servers = append(servers, listener{addr: r.listen, srv: s})
	}
	return servers, lc, nil
}

// clusterInternal reports whether host looks like one of the operator's
// own services rather than a third party's: a one-label name, a name
// under .svc, .cluster.local, .internal or .local, localhost, or a
// loopback or private address. A service's calls to others (a payment
// API) carry none of triage's headers: its customers' names and its
// criticalities are nobody else's business.
func clusterInternal(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback() || ip.IsPrivate()
	}
	if host == "localhost" || !strings.Contains(host, ".") {
		return host != ""
	}
	for _, s := range []string{".svc", ".cluster.local", ".internal", ".local"} {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
}

// egressServer is the server of one -egress route.
func (f *sidecarFlags) egressServer(r egressRoute, m *observers) (*http.Server, error) {
	pol, err := retry.New(retry.WithObserver(m.Client(r.up.Host)))
	if err != nil {
		return nil, err
	}
	opts := []egress.Option{egress.WithPolicy(pol), egress.WithInternal(f.egressInternal...)}
	if len(f.egressInternal) == 0 && clusterInternal(r.up.Hostname()) {
		opts = append(opts, egress.WithInternal(r.up.Hostname()))
	}
	caller, err := egress.New(opts...)
	if err != nil {
		return nil, err
	}
	rt, err := f.transport(r.up)
	if err != nil {
		return nil, err
	}
	h, err := triagesidecar.Egress(r.up, caller, triagesidecar.WithTransport(rt), triagesidecar.WithTimeout(f.timeout))
	if err != nil {
		return nil, err
	}
	return f.server(m.http(h), tlsfiles.Files{})
}

// transport reaches an upstream, with the -upstream-tls files for https.
func (f *sidecarFlags) transport(up *url.URL) (http.RoundTripper, error) {
	var cfg *tls.Config
	if up.Scheme == "https" && f.upstreamTLS.Set() {
		var err error
		if cfg, err = f.upstreamTLS.Client(); err != nil {
			return nil, err
		}
	}
	return triagesidecar.Transport(up, cfg)
}

// server is an HTTP server for h: HTTP/1.1 and HTTP/2, over TLS with
// files, else in the clear (h2c).
func (f *sidecarFlags) server(h http.Handler, files tlsfiles.Files) (*http.Server, error) {
	srv := &http.Server{Handler: h, ConnContext: triagehttp.ConnContext, ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: 5 * time.Minute, MaxHeaderBytes: 64 << 10, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	if !files.Set() {
		srv.Protocols.SetUnencryptedHTTP2(true)
		return srv, nil
	}
	cfg, err := files.Server()
	if err != nil {
		return nil, err
	}
	srv.Protocols.SetHTTP2(true)
	srv.TLSConfig = cfg
	return srv, nil
}
