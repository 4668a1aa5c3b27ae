package triageprom_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/triagegrpc/lb"
	"github.com/triagehq/triage/triageprom"
)

// Two backends over loopback behind the "triage" balancer: the metrics
// show the picks per backend, their state, and the state changes.
func TestBalancerMetricsOverLoopback(t *testing.T) {
	bm := triageprom.New().Balancers()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(bm)
	lb.Register(lb.WithMetrics(bm))

	var eps []resolver.Endpoint
	for range 2 {
		s := grpc.NewServer()
		relay.Register(s, &relay.Tier{Name: "B"})
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go s.Serve(lis)
		defer s.Stop()
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: lis.Addr().String()}}})
	}
	r := manual.NewBuilderWithScheme("promtest")
	r.InitialState(resolver.State{Endpoints: eps})
	cc, err := grpc.NewClient(r.Scheme()+":///b", grpc.WithResolvers(r), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"triage":{"policy":"round_robin"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	// Both connections become ready within a moment of leaving idle;
	// until then round robin uses the ready one.
	cc.Connect()
	healthyBoth := func() bool {
		return testutil.ToFloat64(stateGauge(t, reg, "healthy")) == 2
	}
	for deadline := time.Now().Add(5 * time.Second); !healthyBoth(); {
		if time.Now().After(deadline) {
			t.Fatal("the two backends never became healthy")
		}
		time.Sleep(time.Millisecond) // polling real connections
	}
	for range 20 {
		if _, err := relay.Invoke(context.Background(), cc, "x"); err != nil {
			t.Fatal(err)
		}
	}
	if n := testutil.CollectAndCount(bm, "triage_balancer_picks_total"); n != 2 {
		t.Fatalf("%d picks series, want one per backend", n)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var picks, healthy, toHealthy float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "triage_balancer_picks_total":
				picks += m.GetCounter().GetValue()
			case "triage_balancer_backend_state":
				for _, l := range m.GetLabel() {
					if l.GetName() == "state" && l.GetValue() == "healthy" {
						healthy += m.GetGauge().GetValue()
					}
				}
			case "triage_balancer_state_changes_total":
				for _, l := range m.GetLabel() {
					if l.GetName() == "to" && l.GetValue() == "healthy" {
						toHealthy += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	if picks != 20 || healthy != 2 || toHealthy < 2 {
		t.Fatalf("picks %v (want 20), healthy backends %v (want 2), changes to healthy %v (want 2 or more)", picks, healthy, toHealthy)
	}
	cc.Close()
	if n := testutil.CollectAndCount(bm, "triage_balancer_picks_total"); n != 0 {
		t.Fatalf("%d picks series after the ClientConn closed, want 0", n)
	}
}

// stateGauge sums triage_balancer_backend_state for one state.
func stateGauge(t *testing.T, reg *prometheus.Registry, state string) prometheus.Gauge {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sum"})
	for _, mf := range mfs {
		if mf.GetName() != "triage_balancer_backend_state" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "state" && l.GetValue() == state {
					g.Add(m.GetGauge().GetValue())
				}
			}
		}
	}
	return g
}

// An ejected backend shows as state "unresponsive", and the change to it
// is counted.
func TestBalancerMetricsShowEjection(t *testing.T) {
	bm := triageprom.New().Balancers()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(bm)
	b, err := balance.New(balance.WithObserver(bm.Observer("db")))
	if err != nil {
		t.Fatal(err)
	}
	eps, err := b.SetEndpoints([]string{"db-0", "db-1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range eps {
		e.SetState(balance.Healthy)
	}
	bm.Add("db", b)
	for range balance.DefaultEjectAfter {
		e, err := b.Pick()
		for err == nil && e != eps[0] {
			e.Done(false)
			e, err = b.Pick()
		}
		if err != nil {
			t.Fatal(err)
		}
		e.DoneUnanswered()
	}
	if v := testutil.ToFloat64(stateGauge(t, reg, "unresponsive")); v != 1 {
		t.Fatalf("%v backends unresponsive, want 1", v)
	}
}
