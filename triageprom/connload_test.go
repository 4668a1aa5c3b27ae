package triageprom_test

import (
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/triagehq/triage/connload"
	"github.com/triagehq/triage/triageprom"
)

// The connection series follow a real loopback listener: two accepted,
// one closed; two health checks.
func TestConnLoadState(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := connload.NewListener(raw)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(triageprom.ConnLoadState(l))
	for range 2 {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	a, _ := l.Accept()
	b, _ := l.Accept()
	defer b.Close()
	a.Close()
	l.HealthCheck()
	l.HealthCheck()
	want := `
# HELP triage_connections_accepted_total Connections accepted.
# TYPE triage_connections_accepted_total counter
triage_connections_accepted_total 2
# HELP triage_connections_open Connections open now.
# TYPE triage_connections_open gauge
triage_connections_open 1
# HELP triage_health_checks_total Health checks answered (checks, and health watches opened).
# TYPE triage_health_checks_total counter
triage_health_checks_total 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "triage_connections_open", "triage_connections_accepted_total", "triage_health_checks_total"); err != nil {
		t.Fatal(err)
	}
}
