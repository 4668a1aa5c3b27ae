package triagegrpc

import (
	"context"
	"sync/atomic"
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/loadreport"
	"github.com/triagehq/triage/triagegrpc/internal/backenderr"
	"github.com/triagehq/triage/wire"
)

// The ORCA trailer (wire.LoadReportKey): grpc-go's clients parse it
// into balancer.DoneInfo.ServerLoad when google.golang.org/grpc/orca is
// linked, so stock weighted_round_robin can use triage's reports.

// reportEvery is how often the cached trailer is rebuilt: the load report
// is marshaled once per interval, not once per response.
const reportEvery = 100 * time.Millisecond

// trailers builds the trailer every response carries: the load report
// (WithLoadReports) and the lame duck announcement (WithLifecycle).
type trailers struct {
	meter     *loadreport.Meter
	lifecycle *lifecycle.Lifecycle
	since     func() time.Duration // the server's clock
	cached    atomic.Pointer[cachedTrailer]
}

type cachedTrailer struct {
	at   time.Duration
	lame bool
	md   metadata.MD
}

func (t *trailers) enabled() bool { return t != nil && (t.meter != nil || t.lifecycle != nil) }

// get returns the current trailer, shared and read-only (grpc copies it).
func (t *trailers) get() metadata.MD {
	now := t.since()
	lame := t.lifecycle != nil && t.lifecycle.InLameDuck()
	if c := t.cached.Load(); c != nil && c.lame == lame && (t.meter == nil || now-c.at < reportEvery) {
		return c.md
	}
	md := metadata.MD{}
	if lame {
		md[wire.LameDuckKey] = []string{"1"}
	}
	if t.meter != nil {
		l := t.meter.Load()
		b, err := proto.Marshal(&v3orcapb.OrcaLoadReport{
			RpsFractional: l.QPS, Eps: l.EPS, NamedMetrics: map[string]float64{wire.ReportSpanMetric: l.Span.Seconds()},
			CpuUtilization: l.Utilization, ApplicationUtilization: l.Utilization,
		})
		if err == nil {
			md[wire.LoadReportKey] = []string{string(b)}
		}
	}
	t.cached.Store(&cachedTrailer{at: now, lame: lame, md: md})
	return md
}

// finish records the call's outcome in the meter and sets the trailer.
func (t *trailers) finish(ctx context.Context, err error) {
	if t.meter != nil {
		t.meter.Record(backenderr.Failed(err))
	}
	if md := t.get(); len(md) > 0 {
		_ = grpc.SetTrailer(ctx, md)
	}
}

func (t *trailers) finishStream(ss grpc.ServerStream, err error) {
	if t.meter != nil {
		t.meter.Record(backenderr.Failed(err))
	}
	if md := t.get(); len(md) > 0 {
		ss.SetTrailer(md)
	}
}
