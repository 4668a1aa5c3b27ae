// Package e2e holds triage's end-to-end tests over real loopback sockets:
// an HTTP frontend, two gRPC hops, trusted and untrusted peers.
package e2e

// Tests here assert behaviour: who was served, where requests went, what
// a handler saw. Thresholds on rates, shares and latencies measured over
// wall-clock time depend on the machine's load (go test ./... runs the
// drill's processes beside them), so they are asserted only in
// measurements, with TRIAGE_MEASURE=1 (see measuring).
