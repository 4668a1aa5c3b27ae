package lb

import (
	"errors"
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/internal/backenderr"
	"github.com/triagehq/triage/wire"
)

var (
	errBlackHole    = triagegrpc.Status(isolate.ErrBlackHoled).Err()
	errNoSacrifical = status.Error(codes.Unavailable, "triage: no backend on this client type's route")
)

type picker struct {
	b         *triageBalancer
	core, sac *balance.Balancer
}

// errFlowControl is the answer when every backend has the client's
// MaxActive requests: task overloaded (UNAVAILABLE), the client's own
// judgement that the backends are full, so that its throttle counts it as
// a rejection and its retry policy treats it as an overload.
var errFlowControl = triagegrpc.Status(&outcome.Error{Kind: outcome.TaskOverloaded, Reason: "every backend in the subset is at the client's flow-control cap"}).Err()

func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	core := p.core
	if iso := p.b.iso; iso != nil {
		p.b.repartition()
		route, decided := isolate.RouteFrom(info.Ctx) // by the caller's egress, when it has the table
		if !decided {
			route = iso.RouteOf(isolate.ClientOf(info.Ctx))
		}
		switch route {
		case isolate.BlackHole:
			return balancer.PickResult{}, errBlackHole
		case isolate.Sacrificial:
			core = p.sac
		}
		if len(core.Endpoints()) == 0 {
			return balancer.PickResult{}, errNoSacrifical
		}
	}
	// An endpoint's own picker can fail for a moment before its new state
	// reaches this picker (a backend entering lame duck turns its health
	// check NOT_SERVING): try up to two other endpoints before failing
	// the call.
	var (
		r   balancer.PickResult
		d   *endpointData
		err error
	)
	pick := core.Pick
	if criticality.Of(info.Ctx) >= criticality.Critical {
		pick = core.PickCritical // not spent as a probe of an ejected backend
	}
	for try := 0; try < 3; try++ {
		e, perr := pick()
		if errors.Is(perr, balance.ErrFlowControl) {
			// Every healthy backend has MaxActive of this client's
			// requests: fail at once rather than leave the call blocked in
			// the client until its deadline (the book's warning about this
			// limit).
			return balancer.PickResult{}, errFlowControl
		}
		if perr != nil {
			// No backend is ready (lame duck ones are picked when no
			// other is): the call waits for a new picker (grpc-go blocks
			// on ErrNoSubConnAvailable until the state changes or the
			// deadline).
			return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
		}
		d, _ = e.Value().(*endpointData)
		if d == nil || d.picker == nil {
			e.Release()
			return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
		}
		if r, err = d.picker.Pick(info); err == nil {
			break
		}
		e.Release()
	}
	if err != nil {
		return r, err
	}
	done := d.done
	if deadline, ok := info.Ctx.Deadline(); ok {
		e, lame, picked := d.e, d.lame, time.Now()
		done = func(di balancer.DoneInfo) { finish(e, di, unanswered(di, picked, deadline), lame) }
	}
	if inner := r.Done; inner != nil {
		r.Done = func(di balancer.DoneInfo) { done(di); inner(di) }
	} else {
		r.Done = done
	}
	return r, nil
}

// unanswered says a call ended with nothing of use from the backend after
// waiting at least nine tenths of its time: nothing received at its
// deadline, or cancelled just before it by a caller upstream whose
// deadline came first (each hop's deadline is a little later than its
// caller's), or the backend's own DEADLINE_EXCEEDED then (a backend whose
// dependencies hang answers so).
func unanswered(di balancer.DoneInfo, picked, deadline time.Time) bool {
	switch c := status.Code(di.Err); {
	case c == codes.DeadlineExceeded:
	case c == codes.Canceled && !di.BytesReceived:
	default:
		return false
	}
	budget := deadline.Sub(picked)
	return budget > 0 && time.Since(picked) >= budget-budget/10
}

// doneFunc is an endpoint's completion: it ends the active request,
// counts backend errors, takes the load report and the lame duck
// announcement from the trailer.
func doneFunc(e *balance.Endpoint, lame func()) func(balancer.DoneInfo) {
	return func(di balancer.DoneInfo) { finish(e, di, false, lame) }
}

// finish ends a call on e: unanswered, or answered and counted against
// the backend if its error says so; then the trailer's load report and
// lame duck announcement (lame is called when it is new).
func finish(e *balance.Endpoint, di balancer.DoneInfo, unanswered bool, lame func()) {
	switch c := status.Code(di.Err); {
	case unanswered:
		e.DoneUnanswered()
	case !di.BytesReceived && (c == codes.Canceled || c == codes.DeadlineExceeded):
		e.Release() // given up early: no answer, and no evidence of none
	case (c == codes.Unavailable || c == codes.ResourceExhausted) && refusedOnItsOwn(di.Err):
		e.Refused() // the codes triage's refusals carry: nothing else is decoded
	default:
		e.Done(backenderr.Failed(di.Err))
	}
	if l, ok := di.ServerLoad.(*v3orcapb.OrcaLoadReport); ok && l != nil {
		e.Report(loadOf(l))
	}
	if v := di.Trailer.Get(wire.LameDuckKey); len(v) > 0 && v[0] == "1" {
		was := e.State()
		e.SetState(balance.LameDuck)
		if was != balance.LameDuck {
			lame()
		}
	}
}

// refusedOnItsOwn says err is a triage refusal the backend made on its
// own account (it was overloaded, or the caller out of quota), not one
// relayed from its dependencies: an answer from a live backend.
func refusedOnItsOwn(err error) bool {
	if err == nil {
		return false
	}
	oe, ok := triagegrpc.FromStatus(status.Convert(err))
	return ok && !oe.Relayed()
}

// loadOf reads an ORCA load report: the application utilization, else the
// CPU's, and the span of triage's backends (wire.ReportSpanMetric; 0 when
// absent or not a number of seconds up to a day).
func loadOf(l *v3orcapb.OrcaLoadReport) balance.Load {
	u := l.GetApplicationUtilization()
	if u <= 0 {
		u = l.GetCpuUtilization()
	}
	var span time.Duration
	if s := l.GetNamedMetrics()[wire.ReportSpanMetric]; s > 0 && s <= 86400 {
		span = time.Duration(s * float64(time.Second))
	}
	return balance.Load{QPS: l.GetRpsFractional(), EPS: l.GetEps(), Utilization: u, Span: span}
}
