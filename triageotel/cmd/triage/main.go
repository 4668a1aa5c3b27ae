// Command triage is cmd/triage with OpenTelemetry: the serving commands
// (sidecar, extproc, proxy, quota-server) take -otlp-endpoint and export
// triageotel's metrics and request spans over OTLP/gRPC, beside their
// Prometheus metrics. Everything else is the same command.
//
//	go install github.com/triagehq/triage/triageotel/cmd/triage@latest
//	triage sidecar -upstream http://127.0.0.1:8080 -otlp-endpoint 127.0.0.1:4317 -otlp-insecure
//
// OpenTelemetry's environment (OTEL_EXPORTER_OTLP_*, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES) applies; the flags win where both are given.
package main

import (
	"os"

	"github.com/triagehq/triage/cmd/triage/app"
)

// version and commit are set by a build that knows them (-ldflags -X).
var version, commit string

func main() {
	os.Exit(app.Main(os.Args[1:], app.WithVersion(version, commit), app.WithTelemetry(&otlp{})))
}
