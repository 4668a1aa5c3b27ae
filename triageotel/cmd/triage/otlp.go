package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/triagehq/triage/quota/allocate"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/cmd/triage/app"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/shadow"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotareplica"
	"github.com/triagehq/triage/triageotel"
)

// otlp is the app.Telemetry of this build: OTLP/gRPC to a collector.
type otlp struct {
	endpoint string
	insecure bool
	interval time.Duration
	ratio    float64
}

// DefaultTraceRatio is -otlp-trace-ratio: the share of requests whose
// caller did not decide that a span is recorded for, so that tracing
// costs little under the overload the command exists for.
const DefaultTraceRatio = 0.01

// Register implements app.Telemetry.
func (o *otlp) Register(fs *flag.FlagSet) {
	fs.StringVar(&o.endpoint, "otlp-endpoint", "", "export OpenTelemetry metrics and spans over OTLP/gRPC to this HOST:PORT (a collector); default: none, unless OTEL_EXPORTER_OTLP_ENDPOINT is set")
	fs.BoolVar(&o.insecure, "otlp-insecure", false, "talk to -otlp-endpoint without TLS (a collector on loopback or in the pod)")
	fs.DurationVar(&o.interval, "otlp-interval", 15*time.Second, "how often metrics are exported")
	fs.Float64Var(&o.ratio, "otlp-trace-ratio", DefaultTraceRatio, "share of requests traced when their caller sent no sampling decision (a caller's decision is followed)")
}

// Start implements app.Telemetry: nil when no endpoint is given.
func (o *otlp) Start(ctx context.Context, command string) (app.Sink, error) {
	if o.endpoint == "" && os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" {
		return nil, nil
	}
	switch {
	case o.interval <= 0:
		return nil, errors.New("-otlp-interval must be positive")
	case o.ratio < 0 || o.ratio > 1:
		return nil, errors.New("-otlp-trace-ratio must be between 0 and 1")
	}
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", "triage-"+command)), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("OpenTelemetry resource: %w", err)
	}
	var mopts []otlpmetricgrpc.Option
	var topts []otlptracegrpc.Option
	if o.endpoint != "" {
		mopts, topts = append(mopts, otlpmetricgrpc.WithEndpoint(o.endpoint)), append(topts, otlptracegrpc.WithEndpoint(o.endpoint))
	}
	if o.insecure {
		mopts, topts = append(mopts, otlpmetricgrpc.WithInsecure()), append(topts, otlptracegrpc.WithInsecure())
	}
	mexp, err := otlpmetricgrpc.New(ctx, mopts...)
	if err != nil {
		return nil, fmt.Errorf("OTLP metrics: %w", err)
	}
	texp, err := otlptracegrpc.New(ctx, topts...)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("OTLP traces: %w", err), mexp.Shutdown(ctx))
	}
	s := &sink{
		command: command,
		mp:      sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp, sdkmetric.WithInterval(o.interval)))),
		tp: sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(texp),
			sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.ratio)))),
	}
	if s.m, err = triageotel.New(s.mp); err == nil {
		s.tr, err = triageotel.NewTracer(s.tp)
	}
	if err != nil {
		return nil, errors.Join(err, s.Shutdown(ctx))
	}
	return s, nil
}

// sink is the app.Sink of one command: triageotel's metrics and tracer
// on providers that export over OTLP.
type sink struct {
	command string
	mp      *sdkmetric.MeterProvider
	tp      *sdktrace.TracerProvider
	m       *triageotel.Metrics
	tr      *triageotel.Tracer
}

func (s *sink) Admission() admission.Observer       { return s.m.Admission() }
func (s *sink) Shadow() shadow.Observer             { return s.m.Shadow() }
func (s *sink) Client(target string) retry.Observer { return s.m.Client(target) }
func (s *sink) Tracer() intake.Tracer               { return s.tr.Intake() }

func (s *sink) AdmissionState(ctl *admission.Controller, labels map[string]string) error {
	kv := make([]attribute.KeyValue, 0, len(labels))
	for k, v := range labels {
		kv = append(kv, attribute.String(k, v))
	}
	_, err := s.m.AdmissionState(ctl, kv...)
	return err
}

func (s *sink) QuotaService(a *allocate.Allocator) error {
	_, err := s.m.QuotaService(a)
	return err
}

func (s *sink) QuotaReplica(r *quotareplica.Replica) error {
	_, err := s.m.QuotaReplica(r)
	return err
}

// HTTP gives each request a server span, which triage's decisions are
// recorded on.
func (s *sink) HTTP(h http.Handler) http.Handler {
	return otelhttp.NewHandler(h, "triage "+s.command, otelhttp.WithTracerProvider(s.tp), otelhttp.WithMeterProvider(s.mp))
}

// GRPC gives each call a server span.
func (s *sink) GRPC() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(s.tp), otelgrpc.WithMeterProvider(s.mp)))}
}

// Shutdown exports what is left and stops.
func (s *sink) Shutdown(ctx context.Context) error {
	return errors.Join(s.tp.Shutdown(ctx), s.mp.Shutdown(ctx))
}
