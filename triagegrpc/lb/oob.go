package lb

import (
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/orca" // also parses endpoint-load-metrics-bin trailers into DoneInfo.ServerLoad
	"google.golang.org/grpc/resolver"
)

// NewSubConn is the children's, through endpointsharding; with
// OOBLoadReport, each SubConn that becomes ready subscribes to its
// backend's out-of-band load reports until it is no longer ready.
func (b *triageBalancer) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	b.mu.Lock()
	on := b.cfg != nil && b.cfg.OOBLoadReport
	var period time.Duration
	if on {
		period = b.cfg.oobPeriod
	}
	b.mu.Unlock()
	if !on || len(addrs) == 0 {
		return b.ClientConn.NewSubConn(addrs, opts)
	}
	id := addrs[0].Addr
	var sc balancer.SubConn
	inner := opts.StateListener
	opts.StateListener = func(st balancer.SubConnState) {
		b.oobState(sc, id, st.ConnectivityState, period)
		if inner != nil {
			inner(st)
		}
	}
	sc, err := b.ClientConn.NewSubConn(addrs, opts)
	return sc, err
}

// oobState starts or stops a SubConn's out-of-band listener as it becomes
// ready or stops being ready. grpc-go calls it serially per SubConn.
func (b *triageBalancer) oobState(sc balancer.SubConn, id string, st connectivity.State, period time.Duration) {
	b.mu.Lock()
	stop, listening := b.oob[sc]
	if st != connectivity.Ready && listening {
		delete(b.oob, sc)
	}
	closed := b.isClosed()
	b.mu.Unlock()
	switch {
	case st == connectivity.Ready && !listening && !closed:
		stop := orca.RegisterOOBListener(sc, oobListener{b: b, id: id}, orca.OOBListenerOptions{ReportInterval: period})
		b.mu.Lock()
		b.oob[sc] = stop
		b.mu.Unlock()
	case st != connectivity.Ready && listening:
		stop()
	}
}

// oobListener takes one backend's out-of-band reports to its endpoint, or
// keeps the latest until the endpoint exists.
type oobListener struct {
	b  *triageBalancer
	id string
}

func (l oobListener) OnLoadReport(r *v3orcapb.OrcaLoadReport) {
	load := loadOf(r)
	l.b.mu.Lock()
	e := l.b.endpoints[l.id]
	if e == nil {
		if _, member := l.b.byID[l.id]; member {
			l.b.oobPending[l.id] = load
		}
	}
	l.b.mu.Unlock()
	if e != nil {
		e.Report(load)
	}
}
