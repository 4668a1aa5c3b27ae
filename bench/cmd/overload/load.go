package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/measure"
	"github.com/triagehq/triage/loadtest"
	"github.com/triagehq/triage/outcome"
)

// share is one criticality's part of the offered load.
type share struct {
	level criticality.Level
	frac  float64
}

// sample is one request's fate.
type sample struct {
	at      time.Duration // scheduled send time since the phase start
	latency time.Duration // completion - scheduled send time
	code    codes.Code
	level   criticality.Level
	triaged bool // the error carried a triage overload outcome
	over    time.Duration
}

// phase is what an open-loop phase produced.
type phase struct {
	samples  []sample
	sent     int64
	done     int64
	maxLag   time.Duration
	lagOver  int64 // sends more than 10 ms behind schedule
	duration time.Duration
}

// maxOutstanding bounds the calls in flight of one phase: the rate times
// the deadline, plus slack; beyond it the generator stops sending and the
// phase is marked invalid (it cannot keep its schedule).
func maxOutstanding(rate float64, deadline time.Duration) int64 {
	return int64(rate*deadline.Seconds()*2) + 1000
}

// openLoop sends rate requests per second for d, spread over conns,
// latency measured from each request's scheduled time, every call bounded
// by deadline; it waits for every call to finish.
func openLoop(ctx context.Context, conns []grpc.ClientConnInterface, rate float64, d, deadline time.Duration, mix []share, seed uint64) *phase {
	p, levels, at := schedule(rate, d, mix, seed, 1)
	pacer := loadtest.OpenLoop{Early: early, MaxInFlight: int(maxOutstanding(rate, deadline)), Skip: func(i int, _ time.Duration) {
		p.samples[i] = sample{at: p.samples[i].at, code: codes.Canceled, level: levels[i]}
	}}
	paced := pacer.Run(ctx, at, func(i int, lag time.Duration) func() {
		sched := time.Now().Add(-lag) // the call's time in the schedule
		return func() {
			cctx, cancel := context.WithDeadline(criticality.NewContext(ctx, levels[i]), sched.Add(deadline))
			defer cancel()
			out := new(wrapperspb.StringValue)
			err := conns[i%len(conns)].Invoke(cctx, method, wrapperspb.String("x"), out)
			end := time.Now()
			p.samples[i] = sample{at: p.samples[i].at, latency: end.Sub(sched), code: status.Code(err), level: levels[i], triaged: triaged(err),
				over: end.Sub(sched.Add(deadline))}
			atomic.AddInt64(&p.done, 1)
		}
	})
	p.paced(paced)
	return p
}

// early is how far ahead of its time the generator sends rather than
// sleep: a shorter sleep overshoots by more than the gap between sends
// at 20x.
const early = 200 * time.Microsecond

// paced records what the pacer did: the sends made, the sends cut short
// (an unsent call counts as late: the phase could not keep its
// schedule), the samples of the schedule that ran.
func (p *phase) paced(r loadtest.Paced) {
	p.sent = int64(r.Sent)
	p.maxLag = r.MaxLag
	p.lagOver = int64(r.Late + r.Skipped)
	if r.Stopped {
		p.samples = p.samples[:r.Sent+r.Skipped]
	}
}

// schedule lays out a phase of rate calls per second for d: its samples
// with their times, each call's criticality drawn from mix, and the
// schedule to pace.
func schedule(rate float64, d time.Duration, mix []share, seed, stream uint64) (*phase, []criticality.Level, func(int) (time.Duration, bool)) {
	at := loadtest.Every(rate, d)
	n := int(rate * d.Seconds())
	rng := rand.New(rand.NewPCG(seed, stream))
	levels := make([]criticality.Level, n)
	p := &phase{duration: d, samples: make([]sample, n)}
	for i := range levels {
		levels[i] = pick(mix, rng.Float64())
		p.samples[i].at, _ = at(i)
	}
	return p, levels, at
}

// triaged says whether err carries a triage overload outcome.
func triaged(err error) bool {
	_, ok := outcome.As(err)
	return ok || errors.Is(err, outcome.ErrTaskOverloaded)
}

func pick(mix []share, u float64) criticality.Level {
	for _, s := range mix {
		if u < s.frac {
			return s.level
		}
		u -= s.frac
	}
	return mix[len(mix)-1].level
}

// summary is a phase's figures over [from, to) of its schedule.
type summary struct {
	offered, ok     int
	goodputRPS      float64
	p50, p99        time.Duration
	codes           map[codes.Code]int
	byLevel         map[criticality.Level][2]int // ok, total
	maxOver         time.Duration
	untriagedFailed int
}

func summarize(p *phase, from, to time.Duration) summary {
	s := summary{codes: map[codes.Code]int{}, byLevel: map[criticality.Level][2]int{}}
	var lat []time.Duration
	for _, x := range p.samples {
		if x.at < from || x.at >= to {
			continue
		}
		s.offered++
		s.codes[x.code]++
		b := s.byLevel[x.level]
		b[1]++
		if x.code == codes.OK {
			s.ok++
			b[0]++
			lat = append(lat, x.latency)
		} else if !x.triaged && x.code != codes.Canceled {
			s.untriagedFailed++
		}
		s.byLevel[x.level] = b
		s.maxOver = max(s.maxOver, x.over)
	}
	s.goodputRPS = float64(s.ok) / (to - from).Seconds()
	if len(lat) > 0 {
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		s.p50 = measure.QuantileDuration(lat, 0.5)
		s.p99 = measure.QuantileDuration(lat, 0.99)
	}
	return s
}

// workersLoop is a stock load tool's closed loop (ghz --rps rate -c
// workers -z d): workers callers spread over conns, each sending its next
// call as soon as its last returns, all drawing from one schedule of rate
// calls per second, until d has passed. With thousands of workers the
// generator's own core saturates, as a stock tool's does, and calls fall
// behind the schedule in the client; as a stock tool does, each call's
// time and latency are taken from when it is sent, and its deadline set
// then. At most rate x d calls, each bounded by deadline; it waits for
// every worker to finish.
func workersLoop(ctx context.Context, conns []grpc.ClientConnInterface, rate float64, d, deadline time.Duration, workers int, mix []share, seed uint64) *phase {
	p, levels, _ := schedule(rate, d, mix, seed, 2)
	n := len(levels)
	var next atomic.Int64 // the next slot of the schedule
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(cc grpc.ClientConnInterface) {
			defer wg.Done()
			for ctx.Err() == nil && time.Since(start) < d {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if wait := time.Until(start.Add(p.samples[i].at)); wait > 0 {
					time.Sleep(wait)
				}
				sent := time.Now()
				cctx, cancel := context.WithDeadline(criticality.NewContext(ctx, levels[i]), sent.Add(deadline))
				err := cc.Invoke(cctx, method, wrapperspb.String("x"), new(wrapperspb.StringValue))
				cancel()
				end := time.Now()
				p.samples[i] = sample{at: sent.Sub(start), latency: end.Sub(sent), code: status.Code(err), level: levels[i],
					over: end.Sub(sent.Add(deadline)), triaged: triaged(err)}
				atomic.AddInt64(&p.sent, 1)
				atomic.AddInt64(&p.done, 1)
			}
		}(conns[w%len(conns)])
	}
	wg.Wait()
	p.samples = p.samples[:min(int(next.Load()), n)] // every slot taken was sent
	return p
}
