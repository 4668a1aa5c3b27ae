// Command triage is the toolkit's CLI (package app): the overload drill,
// a load test for your own service, the quota service, the batch proxy,
// the sidecar, Envoy's external processor and the book's simulations.
// `triage help` lists them. triageotel/cmd/triage is the same command
// with OpenTelemetry export.
package main

import (
	"os"

	"github.com/triagehq/triage/cmd/triage/app"
)

// version and commit are set by a build that knows them and cannot
// leave them in the build info (the Dockerfile builds without .git):
//
//	go build -ldflags "-X main.version=v0.1.0 -X main.commit=$(git rev-parse HEAD)" ./cmd/triage
var version, commit string

func main() { os.Exit(app.Main(os.Args[1:], app.WithVersion(version, commit))) }
