package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/triagehq/triage/quota/allocate"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/cmd/triage/internal/tlsfiles"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/shadow"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotareplica"
	"github.com/triagehq/triage/triageprom"
)

// An Option configures the command Main runs.
type Option func(*options)

type options struct {
	version, commit string
	telemetry       Telemetry
}

// WithVersion sets what `triage version` prints: a build's -ldflags -X
// values (empty: the build info's).
func WithVersion(version, commit string) Option {
	return func(o *options) { o.version, o.commit = version, commit }
}

// WithTelemetry adds t's flags to the serving commands (sidecar, extproc,
// proxy, quota-server), and reports what they do to t's Sink beside their
// Prometheus metrics.
func WithTelemetry(t Telemetry) Option { return func(o *options) { o.telemetry = t } }

// Telemetry is a second place a serving command reports to: OpenTelemetry
// in triageotel/cmd/triage, which the core module cannot import.
type Telemetry interface {
	// Register adds its flags to a command's flag set.
	Register(fs *flag.FlagSet)
	// Start begins reporting for the command named, once its flags are
	// parsed: a nil Sink when they ask for nothing. The command calls the
	// Sink's Shutdown when it stops.
	Start(ctx context.Context, command string) (Sink, error)
}

// Sink takes what a command reports. The command calls each method once
// per thing it builds, before it serves.
type Sink interface {
	Admission() admission.Observer
	// AdmissionState reports ctl's state, with labels (extproc: the
	// cluster) when there are several controllers.
	AdmissionState(ctl *admission.Controller, labels map[string]string) error
	Shadow() shadow.Observer
	Client(target string) retry.Observer
	QuotaService(a *allocate.Allocator) error
	QuotaReplica(r *quotareplica.Replica) error
	// Tracer is told of each request's decisions (nil: none).
	Tracer() intake.Tracer
	// HTTP wraps a server's handler, outermost (a span for each request).
	HTTP(h http.Handler) http.Handler
	// GRPC returns options for a gRPC server (a stats handler).
	GRPC() []grpc.ServerOption
	Shutdown(ctx context.Context) error
}

// observers are where a serving command reports: triageprom's metrics,
// on the registry -metrics serves, and the build's Sink (nil: none).
type observers struct {
	prom *triageprom.Metrics
	sink Sink
}

// Admission returns the observers of an admission controller: the
// registry's, and the sink's if there is one.
func (o *observers) Admission() []admission.Observer {
	if o.sink == nil {
		return []admission.Observer{o.prom.Admission()}
	}
	return []admission.Observer{o.prom.Admission(), o.sink.Admission()}
}

// Shadow returns the observer of shadow mode.
func (o *observers) Shadow() shadow.Observer {
	if o.sink == nil {
		return o.prom.Shadow()
	}
	return shadow.Tee(o.prom.Shadow(), o.sink.Shadow())
}

// Client returns the observer of a retry policy to target.
func (o *observers) Client(target string) retry.Observer {
	if o.sink == nil {
		return o.prom.Client(target)
	}
	return retry.Tee(o.prom.Client(target), o.sink.Client(target))
}

// admissionState registers ctl's state with reg (which wraps labels, if
// any) and the sink.
func (o *observers) admissionState(ctl *admission.Controller, reg prometheus.Registerer, labels map[string]string) error {
	if err := reg.Register(triageprom.AdmissionState(ctl)); err != nil {
		return err
	}
	if o.sink == nil {
		return nil
	}
	return o.sink.AdmissionState(ctl, labels)
}

// tracer returns the sink's tracer, or nil.
func (o *observers) tracer() intake.Tracer {
	if o.sink == nil {
		return nil
	}
	return o.sink.Tracer()
}

// intake returns the intake options the sink asks for.
func (o *observers) intake() []intake.Option {
	if t := o.tracer(); t != nil {
		return []intake.Option{intake.WithTracer(t)}
	}
	return nil
}

// http wraps a server's handler for the sink.
func (o *observers) http(h http.Handler) http.Handler {
	if o.sink == nil {
		return h
	}
	return o.sink.HTTP(h)
}

// grpc returns the sink's gRPC server options.
func (o *observers) grpc() []grpc.ServerOption {
	if o.sink == nil {
		return nil
	}
	return o.sink.GRPC()
}

// startTelemetry starts the build's telemetry for command, if any: the
// observers to report to, and the function that stops it.
func (opt *options) startTelemetry(ctx context.Context, command string, prom *triageprom.Metrics) (*observers, func(), error) {
	o := &observers{prom: prom}
	if opt == nil || opt.telemetry == nil {
		return o, func() {}, nil
	}
	sink, err := opt.telemetry.Start(ctx, command)
	if err != nil || sink == nil {
		return o, func() {}, err
	}
	o.sink = sink
	return o, func() {
		// What is left to export goes out now, within a bound.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = sink.Shutdown(sctx)
	}, nil
}

// serving is what a serving command starts with: its logger, the
// registry -metrics serves (triageprom's metrics in it), where it reports,
// and the function that stops the build's telemetry.
type serving struct {
	log  *slog.Logger
	reg  *prometheus.Registry
	obs  *observers
	stop func()
}

// startServing starts a serving command's logger, metrics and the build's
// telemetry; on failure it has told stderr or the log why, and returns
// the exit code.
func (opt *options) startServing(ctx context.Context, command string, lf *logFlags, stderr io.Writer) (*serving, int) {
	log, err := lf.logger(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "triage %s: %v\n", command, err)
		return nil, 2
	}
	prom := triageprom.New()
	reg := newRegistry()
	reg.MustRegister(prom)
	m, stop, err := opt.startTelemetry(ctx, command, prom)
	if err != nil {
		log.Error(command+" cannot start its telemetry", "err", err)
		return nil, 1
	}
	return &serving{log: log, reg: reg, obs: m, stop: stop}, 0
}

// parse parses a serving command's args into fs, with the build's
// telemetry flags, and warns on stderr of a deprecated TLS flag in tls;
// when it fails, the int is the exit status (0 for -help).
func (opt *options) parse(fs *flag.FlagSet, args []string, stderr io.Writer, tls *tlsfiles.Files) (int, bool) {
	opt.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	warnDeprecated(stderr, fs.Name(), *tls)
	return 0, true
}

// register adds the build's telemetry flags to fs.
func (opt *options) register(fs *flag.FlagSet) {
	if opt != nil && opt.telemetry != nil {
		opt.telemetry.Register(fs)
	}
}
