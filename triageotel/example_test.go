package triageotel_test

import (
	"log"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triageotel"
)

// A gRPC server and its client of a backend, reporting to OpenTelemetry:
// triage's metrics through the MeterProvider, its decisions on the spans
// otelgrpc starts. docs/opentelemetry.md shows this function's body.
func Example() {
	mp := sdkmetric.NewMeterProvider() // with your reader or exporter
	tp := sdktrace.NewTracerProvider() // with your span processor
	m, err := triageotel.New(mp)
	if err != nil {
		log.Fatal(err)
	}
	tr, err := triageotel.NewTracer(tp)
	if err != nil {
		log.Fatal(err)
	}
	cl, err := edge.New(edge.HeaderOnly(), edge.WithObserver(m))
	if err != nil {
		log.Fatal(err)
	}
	ctl, err := admission.New(admission.WithObserver(m.Admission()))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := m.AdmissionState(ctl); err != nil {
		log.Fatal(err)
	}
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithClassifier(cl), intake.WithAdmission(ctl),
		intake.WithTracer(tr.Intake())))
	if err != nil {
		log.Fatal(err)
	}
	gs := grpc.NewServer(append(srv.ServerOptions(),
		grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp))))...)
	defer gs.Stop()

	// The client side: throttling, retries and their budget, on the
	// caller's span.
	policy, err := retry.New(retry.WithObserver(m.Client("backend")), retry.WithTracer(tr.Client()))
	if err != nil {
		log.Fatal(err)
	}
	caller, err := egress.New(egress.WithPolicy(policy))
	if err != nil {
		log.Fatal(err)
	}
	defer caller.Close()
}
