package triageextproc_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/triageextproc"
	"github.com/triagehq/triage/trust"
)

// One admission controller per upstream cluster (issue 55): a gateway in
// front of two services keeps a controller for each cluster Envoy names
// (xds.cluster_name), so that one service at its limit does not refuse
// the other's requests; requests that name no cluster, and clusters past
// MaxClusters, share the default controller.
func TestEachClusterHasItsOwnController(t *testing.T) {
	made := map[string]*admission.Controller{}
	admit := func(cluster string) (*admission.Controller, error) {
		ctl, err := admission.New(admission.WithLimits(1, 1, 1), admission.WithQueueFactor(0), admission.WithMaxWait(time.Minute))
		made[cluster] = ctl
		return ctl, err
	}
	srv, err := triageextproc.NewPerCluster(admit, intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})))
	if err != nil {
		t.Fatal(err)
	}
	env, stop := envoyFor(t, srv, "127.0.0.1:50000", nil)
	defer stop()
	ctx := context.Background()

	// A request to orders holds orders' one slot.
	env.cluster = "orders"
	hold, err := extprocEnvoyStream(env)
	if err != nil {
		t.Fatal(err)
	}
	loopback.WaitFor(t, "orders' slot held", func() bool { return made["orders"] != nil && made["orders"].Stats().Executing == 1 })
	if a := env.do(ctx, "GET", "/", http.Header{"Triage-Criticality": {"CRITICAL"}}, nil); a.status != 503 {
		t.Errorf("a second request to orders: %d %q, want 503 (its one slot is held)", a.status, a.how)
	}
	env.cluster = "search"
	if a := env.do(ctx, "GET", "/", http.Header{"Triage-Criticality": {"CRITICAL"}}, nil); a.status != 200 {
		t.Errorf("a request to search while orders is full: %d %q, want 200", a.status, a.how)
	}
	env.cluster = ""
	if a := env.do(ctx, "GET", "/", http.Header{"Triage-Criticality": {"CRITICAL"}}, nil); a.status != 200 {
		t.Errorf("a request naming no cluster while orders is full: %d %q, want 200", a.status, a.how)
	}
	hold.CloseSend()
	hold.Recv()

	// Up to MaxClusters clusters get a controller each; past them, new
	// clusters share the default controller: with its one slot held, a
	// request to a new cluster is refused, one to a known cluster is not.
	for i := len(made) - 1; i < triageextproc.MaxClusters; i++ {
		env.cluster = fmt.Sprintf("c%d", i)
		env.do(ctx, "GET", "/", http.Header{}, nil)
	}
	if n := len(made); n != triageextproc.MaxClusters+1 {
		t.Fatalf("%d controllers made, want %d (MaxClusters and the default)", n, triageextproc.MaxClusters+1)
	}
	env.cluster = ""
	if hold, err = extprocEnvoyStream(env); err != nil {
		t.Fatal(err)
	}
	defer func() { hold.CloseSend(); hold.Recv() }()
	env.cluster = "one-too-many"
	if a := env.do(ctx, "GET", "/", http.Header{"Triage-Criticality": {"CRITICAL"}}, nil); a.status != 503 || made["one-too-many"] != nil {
		t.Errorf("a cluster past the bound while the default's slot is held: %d, a controller of its own %v; want 503 from the default's", a.status, made["one-too-many"] != nil)
	}
	env.cluster = "search"
	if a := env.do(ctx, "GET", "/", http.Header{"Triage-Criticality": {"CRITICAL"}}, nil); a.status != 200 {
		t.Errorf("a known cluster while the default's slot is held: %d, want 200", a.status)
	}
}

// clusterAttributes is the request attribute naming the upstream cluster.
func clusterAttributes(req *extprocv3.ProcessingRequest, cluster string) {
	if cluster == "" {
		return
	}
	attrs := req.Attributes["envoy.filters.http.ext_proc"]
	if attrs == nil {
		attrs, _ = structpb.NewStruct(nil)
		req.Attributes = map[string]*structpb.Struct{"envoy.filters.http.ext_proc": attrs}
	}
	attrs.Fields[triageextproc.ClusterAttribute] = structpb.NewStringValue(cluster)
}
