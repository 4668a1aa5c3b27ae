// Package balancing holds triage's end-to-end tests of load balancing in
// the datacenter over real loopback sockets and real backend processes:
// spread and sinkholes against grpc-go's balancers, subsetting, lame duck
// through rolling restarts, warm-up and kills, and client-type isolation.
// They are apart from test/e2e so that go test ./... runs the two sets of
// real-time scenarios at once, each in its own process.
package balancing

// Tests here assert behaviour: who was served, where requests went.
// Thresholds on rates, shares and latencies measured over wall-clock time
// depend on the machine's load, so they are asserted only in
// measurements, with TRIAGE_MEASURE=1 (see measuring).
