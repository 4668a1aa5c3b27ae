package app

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/triagehq/triage/admission/limit"
	"github.com/triagehq/triage/triagegrpc/batchproxy"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http/httpguts"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/cmd/triage/internal/tlsfiles"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/triageyaml"
	"github.com/triagehq/triage/trust"
)

// edgeFlags are the edge of a command that stands in front of a service
// in another process (sidecar, extproc): whom to trust and how to assign
// criticality, from -config (reloaded) or the -trust flags.
type edgeFlags struct {
	config, networks, identities, forwarders string
	trust                                    *trust.Policy
	classifier                               *edge.Classifier
	healthChecks                             []string // -health-check
	groupHeader                              string   // -group-header
}

func (e *edgeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&e.config, "config", "", "YAML file of the edge (trust: networks, identities; criticality: default, rules), read again when it changes")
	fs.StringVar(&e.networks, "trust", "", "comma-separated networks (CIDR) whose criticality, attempt and customer headers are believed; default: nobody's (or -config's)")
	fs.StringVar(&e.identities, "trust-identity", "", "comma-separated identities (URI SANs with their scheme, or DNS SANs) of client certificates whose headers are believed")
	fs.StringVar(&e.forwarders, "trust-forwarder", "", "comma-separated networks (CIDR) of proxies whose x-forwarded-client-cert names the caller, then judged by -trust-identity (a mesh's sidecar: docs/trust.md)")
	fs.Func("health-check", "`PATH` of health checks that pass through (repeatable; e.g. /grpc.health.v1.Health/Check): classified, and answered whatever the load, outside isolation, quotas and admission", func(v string) error {
		if !strings.HasPrefix(v, "/") {
			return fmt.Errorf("%q is not a path (it starts with /)", v)
		}
		e.healthChecks = append(e.healthChecks, v)
		return nil
	})
	fs.Func("group-header", "the request header naming the caller's user group, for the edge's group rules (-config)", func(v string) error {
		if !httpguts.ValidHeaderFieldName(v) {
			return fmt.Errorf("%q is not a header name", v)
		}
		e.groupHeader = v
		return nil
	})
}

// build makes the trust policy and the classifier: -config's, or the
// -trust flags' with criticality from a trusted peer's header (default
// CRITICAL).
func (e *edgeFlags) build() error {
	if e.config != "" {
		if e.networks != "" || e.identities != "" || e.forwarders != "" {
			return fmt.Errorf("-config names whom to trust: give -trust, -trust-identity and -trust-forwarder there, not as flags")
		}
		c, err := triageyaml.LoadEdge(e.config)
		if err != nil {
			return err
		}
		e.trust, e.classifier, err = c.Build()
		return err
	}
	var err error
	if e.trust, err = trust.New(trust.Config{Networks: splitList(e.networks), Identities: splitList(e.identities),
		Forwarders: trust.Forwarders{Networks: splitList(e.forwarders)}}); err != nil {
		return fmt.Errorf("-trust: %w", err)
	}
	e.classifier, err = edge.New(edge.HeaderOnly())
	return err
}

// watch reloads -config until ctx is done.
func (e *edgeFlags) watch(ctx context.Context, log *slog.Logger) error {
	if e.config == "" {
		return nil
	}
	w, err := triageyaml.WatchEdge(e.config, e.trust, e.classifier)
	if err != nil {
		return err
	}
	go w.Run(ctx, func(err error) {
		log.Warn("configuration refused; keeping the last good one", "file", e.config, "err", err)
	})
	return nil
}

// DefaultSidecarQueueFactor is the -queue-factor of sidecar and extproc:
// a short queue (the book: "small queue lengths relative to the thread
// pool size"), so that the requests an interactive upstream serves have
// not waited out their callers' deadlines (docs/sidecar.md).
const DefaultSidecarQueueFactor = 16

// admissionFlags are the admission control of a command in front of a
// service in another process: latency mode (admission.WithTolerance).
type admissionFlags struct {
	off, shadow bool
	maxWait     time.Duration
	waitSvc     float64 // -max-wait-services
	queueFactor int
	minInflight int
	tolerance   float64
	rule        string // -limit-rule
	peerShare   int    // -peer-share
}

func (a *admissionFlags) register(fs *flag.FlagSet, maxWait time.Duration) {
	fs.BoolVar(&a.off, "no-admission", false, "forward everything, without admission control (edge rules and trust still apply)")
	fs.BoolVar(&a.shadow, "shadow", false, "shadow mode: decide as usual, count what would be refused (triage_shadow_would_refuse_total), refuse nothing")
	fs.DurationVar(&a.maxWait, "max-wait", maxWait, "how long a request may wait for a slot at the upstream before it is refused")
	fs.Float64Var(&a.waitSvc, "max-wait-services", DefaultMaxWaitServices, "also bound that wait by this many of the upstream's mean service times (0: -max-wait alone): a queue of about one service time keeps the upstream busy, a longer one only adds waiting")
	fs.IntVar(&a.queueFactor, "queue-factor", DefaultSidecarQueueFactor, "the waiting queue, as a multiple of the number of requests let through at once (0-64)")
	fs.IntVar(&a.minInflight, "min-inflight", 2, "fewest requests let through to the upstream at once, however high its latency (2 keeps a one-thread upstream busy while the next arrives)")
	fs.Float64Var(&a.tolerance, "tolerance", batchproxy.DefaultTolerance, "how far the upstream's latency may rise above its recent best before fewer requests are let through at once (> 1)")
	fs.StringVar(&a.rule, "limit-rule", "latency", "how the number of requests let through at once is found: latency (against a baseline probed at -min-inflight, admission's default) or gradient (against a long-term mean, Netflix's Gradient2; -tolerance is its allowed rise)")
	fs.IntVar(&a.peerShare, "peer-share", DefaultPeerShare, "requests of one untrusted caller address in flight before its next ones may take only half the waiting room, leaving the rest to other callers however many connections it opens (0: off)")
}

// DefaultMaxWaitServices is -max-wait-services: a request waits for the
// upstream at most about one of its service times, and never more than
// -max-wait (admission.WithMaxWaitServiceTimes).
const DefaultMaxWaitServices = 1

// DefaultPeerShare is -peer-share: an untrusted address with more
// requests in flight than this competes for half the room
// (intake.WithPeerShare).
const DefaultPeerShare = 32

// check returns what is wrong with the flags, or "".
func (a *admissionFlags) check() string {
	switch {
	case a.maxWait <= 0 || a.queueFactor < 0 || a.queueFactor > 64 || !(a.tolerance > 1) || a.tolerance > 100:
		return "-max-wait must be positive, -queue-factor between 0 and 64, -tolerance in (1, 100]"
	case !(a.waitSvc >= 0 && a.waitSvc <= 1000):
		return "-max-wait-services must be between 0 and 1000"
	case a.minInflight < 1 || a.minInflight > admission.DefaultMaxLimit:
		return fmt.Sprintf("-min-inflight must be between 1 and %d", admission.DefaultMaxLimit)
	case a.peerShare < 0:
		return "-peer-share must be at least 0"
	case a.rule != "latency" && a.rule != "gradient":
		return fmt.Sprintf("-limit-rule must be latency or gradient, not %q", a.rule)
	}
	return ""
}

// controller returns the admission controller with extra options,
// registered with m and reg; nil with -no-admission.
func (a *admissionFlags) controller(m *observers, reg *prometheus.Registry, extra ...admission.Option) (*admission.Controller, error) {
	if a.off {
		return nil, nil
	}
	return a.newController(m, reg, nil, extra...)
}

// newController makes a controller from the flags, its state exported to reg
// (which wraps labels, if any) and m's sink.
func (a *admissionFlags) newController(m *observers, reg prometheus.Registerer, labels map[string]string, extra ...admission.Option) (*admission.Controller, error) {
	opts := []admission.Option{admission.WithObserver(m.Admission()...), admission.WithMaxWait(a.maxWait),
		admission.WithMaxWaitServiceTimes(a.waitSvc), admission.WithQueueFactor(a.queueFactor), admission.WithTolerance(a.tolerance),
		admission.WithLimits(a.minInflight, 2*a.minInflight, admission.DefaultMaxLimit)}
	if a.rule == "gradient" {
		opts = append(opts, admission.WithLimitRule(limit.NewGradient(int64(a.minInflight), admission.DefaultMaxLimit, a.tolerance)))
	}
	ctl, err := admission.New(append(opts, extra...)...)
	if err != nil {
		return nil, err
	}
	return ctl, m.admissionState(ctl, reg, labels)
}

// warnDeprecated tells stderr of a deprecated TLS flag the command was
// given (it still works, for one minor version).
func warnDeprecated(stderr io.Writer, cmd string, f tlsfiles.Files) {
	if w := f.Deprecated(); w != "" {
		fmt.Fprintln(stderr, cmd+": "+w)
	}
}
