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
	p, levels, interval := schedule(rate, d, mix, seed, 1)
	n := len(levels)
	var done, sent atomic.Int64
	var finished atomic.Bool // every call sent (or given up)
	allDone, once := make(chan struct{}), new(sync.Once)
	start := time.Now()
	record := func(r rawgrpc.Result) {
		sched := start.Add(time.Duration(r.ID) * interval)
		p.samples[r.ID] = sample{at: time.Duration(r.ID) * interval, latency: r.At.Sub(sched), code: r.Code, level: levels[r.ID],
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
	for i := 0; i < n; i++ {
		at := time.Duration(i) * interval
		if wait := time.Until(start.Add(at)); wait > 200*time.Microsecond {
			time.Sleep(wait)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		lag := time.Since(start.Add(at))
		p.maxLag = max(p.maxLag, lag)
		if lag > 10*time.Millisecond {
			p.lagOver++
		}
		p.samples[i] = sample{at: at, latency: deadline, code: codes.DeadlineExceeded, level: levels[i], triaged: false}
		if sent.Load()-done.Load() >= limit {
			p.lagOver++
			p.samples[i].code = codes.Canceled
			continue
		}
		sent.Add(1)
		c := cs[i%len(cs)]
		if err := c.Send(i, headers[levels[i]], start.Add(at+deadline).Sub(time.Now())); err != nil {
			return nil, fmt.Errorf("send %d: %w (read loop: %v)", i, err, c.Err())
		}
		if i+1 == n || time.Until(start.Add(at+interval)) > 0 || (i+1)%len(cs) == 0 {
			for _, c := range cs {
				if err := c.Flush(); err != nil {
					return nil, fmt.Errorf("flush: %w (read loop: %v)", err, c.Err())
				}
			}
		}
	}
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
