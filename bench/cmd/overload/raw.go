package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/triagehq/triage/bench/internal/rawgrpc"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/loadtest"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/wire"
)

// openLoopRaw is openLoop with rawgrpc's generator: the same schedule,
// criticality mix and per-call deadline (grpc-timeout, what is left of
// it at the send), written as frames on conns connections to addr, so
// that the generator's core has margin at 20x. A call the server has not
// answered deadline plus 2 s after the last send counts as
// DeadlineExceeded; the connections are closed before it returns, so
// that no answer writes a sample after.
func openLoopRaw(ctx context.Context, addr string, conns int, rate float64, d, deadline time.Duration, mix []share, seed uint64) (*phase, error) {
	p, levels, at := schedule(rate, d, mix, seed, 1)
	n := len(levels)
	var done, sent atomic.Int64
	var finished atomic.Bool // every call sent (or given up)
	allDone, once := make(chan struct{}), new(sync.Once)
	scheds := make([]time.Time, n) // each call's time in the schedule, set before its send
	record := func(r rawgrpc.Result) {
		sched := scheds[r.ID]
		p.samples[r.ID] = sample{at: p.samples[r.ID].at, latency: r.At.Sub(sched), code: r.Code, level: levels[r.ID],
			triaged: rawTriaged(r.Err), over: r.At.Sub(sched.Add(deadline))}
		if done.Add(1) == sent.Load() && finished.Load() {
			once.Do(func() { close(allDone) })
		}
	}
	msg, _ := proto.Marshal(wrapperspb.String("x"))
	cs := make([]*rawgrpc.Conn, 0, conns)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for range conns {
		c, err := rawgrpc.Dial(addr, method, msg, n/conns+1, record)
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
	}
	var headers [criticality.NumLevels][]hpack.HeaderField
	for _, l := range criticality.All() {
		headers[l] = []hpack.HeaderField{{Name: wire.CriticalityKey, Value: l.String()}}
	}
	limit := maxOutstanding(rate, deadline)
	var cut int64 // calls not sent: limit calls outstanding
	var sendErr error
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	paced := loadtest.OpenLoop{Early: early}.Run(pctx, at, func(i int, lag time.Duration) func() {
		scheds[i] = time.Now().Add(-lag)
		p.samples[i] = sample{at: p.samples[i].at, latency: deadline, code: codes.DeadlineExceeded, level: levels[i], triaged: false}
		if sent.Load()-done.Load() >= limit {
			cut++
			p.samples[i].code = codes.Canceled
			return nil
		}
		sent.Add(1)
		c := cs[i%len(cs)]
		if err := c.Send(i, headers[levels[i]], scheds[i].Add(deadline).Sub(time.Now())); err != nil {
			sendErr = fmt.Errorf("send %d: %w (read loop: %v)", i, err, c.Err())
			stop()
			return nil
		}
		if next, more := at(i + 1); !more || time.Until(scheds[i].Add(next-p.samples[i].at)) > 0 || (i+1)%len(cs) == 0 {
			for _, c := range cs {
				if err := c.Flush(); err != nil {
					sendErr = fmt.Errorf("flush: %w (read loop: %v)", err, c.Err())
					stop()
					return nil
				}
			}
		}
		return nil
	})
	if sendErr != nil {
		return nil, sendErr
	}
	if paced.Stopped {
		return nil, ctx.Err()
	}
	p.maxLag, p.lagOver = paced.MaxLag, int64(paced.Late)+cut
	p.sent = sent.Load()
	finished.Store(true)
	if done.Load() == p.sent {
		once.Do(func() { close(allDone) })
	}
	select {
	case <-allDone:
	case <-time.After(deadline + 2*time.Second):
	case <-ctx.Done():
	}
	p.done = done.Load()
	return p, nil
}

// rawTriaged says whether a raw call's error carries triage's outcome.
func rawTriaged(err error) bool {
	if err == nil {
		return false
	}
	if _, ok := triagegrpc.FromStatus(status.Convert(err)); ok {
		return true
	}
	return triaged(err)
}
