package lb

import (
	"fmt"
	"math"
	"testing"
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/clock"
)

// FuzzLoadReport feeds arbitrary bytes as a backend's ORCA load report
// (the endpoint-load-metrics-bin trailer, as grpc-go's orca package
// decodes it) and a lame duck trailer to an endpoint's completion, under
// weighted round robin: nothing panics, and picks still land on the
// balancer's endpoints, with finite weights.
func FuzzLoadReport(f *testing.F) {
	for _, r := range []*v3orcapb.OrcaLoadReport{
		{CpuUtilization: 0.5, RpsFractional: 100},
		{ApplicationUtilization: 2, Eps: 3, RpsFractional: 1e300},
		{CpuUtilization: -1},
	} {
		b, _ := proto.Marshal(r)
		f.Add(b, "1")
	}
	f.Add([]byte{0x09, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf7, 0x7f}, "") // cpu NaN
	f.Add([]byte{0x0a}, "0")
	f.Fuzz(func(t *testing.T, wire []byte, lame string) {
		clk := clock.NewFake(time.Unix(0, 0))
		b, eps := healthyBalancer(t, balance.WithClock(clk), balance.WithPolicy(balance.WeightedRoundRobin), balance.WithBlackout(0))
		var report v3orcapb.OrcaLoadReport
		di := balancer.DoneInfo{Trailer: metadata.Pairs("triage-lame-duck", lame)}
		if proto.Unmarshal(wire, &report) == nil {
			di.ServerLoad = &report
		}
		for range 3 {
			e, err := b.Pick()
			if err != nil {
				return // every endpoint in lame duck
			}
			doneFunc(e, func() {})(di)
			clk.Advance(2 * time.Second)
		}
		for _, e := range eps {
			if w := e.Weight(); w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
				t.Fatalf("weight %v", w)
			}
		}
		if e, err := b.Pick(); err == nil && e != eps[0] && e != eps[1] {
			t.Fatal(fmt.Sprint("picked an endpoint not in the set: ", e))
		}
	})
}
