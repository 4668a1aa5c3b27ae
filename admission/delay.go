package admission

import (
	"math"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// DelayMeasure says how a Controller measures the queueing delay that
// bounds its pending cap: the time requests could have run and did not.
type DelayMeasure uint8

const (
	// SchedulerDelay is the mean time the process's goroutines waited in
	// Go's run queue before running, over each interval (runtime/metrics
	// /sched/latencies:seconds). In a Go server admitted requests queue as
	// runnable goroutines, so this is their queue, measured on the server
	// side only: a client slow to send its message, or a transport waiting
	// for window updates, keeps its goroutine blocked, not runnable, and
	// adds nothing.
	SchedulerDelay DelayMeasure = iota + 1
	// ArrivalDelay is the mean time sampled requests waited from Arrive to
	// Start. It also counts time the transport spent waiting for the
	// client, so it suits transports that call Arrive once the request is
	// complete, and simulations on virtual time, whose run queue is
	// modelled.
	ArrivalDelay
)

// delaySource reads the mean queueing delay since its last reading, and
// how many waits it saw: schedDelay, or a test's.
type delaySource interface {
	read() (mean time.Duration, n uint64)
}

// schedDelay reads the mean scheduling latency since its last reading.
// It is called under the Controller's adjust lock, once per interval.
type schedDelay struct {
	mu     sync.Mutex
	rmu    sync.Mutex // sample[1]
	sample [2]metrics.Sample
	last   []uint64
	nprocs atomic.Int64 // GOMAXPROCS, read with each delay
}

func newSchedDelay() *schedDelay {
	s := &schedDelay{}
	s.sample[0].Name = "/sched/latencies:seconds"
	s.sample[1].Name = "/sched/goroutines/runnable:goroutines"
	s.read() // the baseline: delays before the Controller existed do not count
	return s
}

// read returns the mean run-queue wait of the goroutines scheduled since
// the last read, and how many there were (sampled by the runtime). A
// bucket counts at its midpoint (its finite edge when the other is
// infinite).
func (s *schedDelay) read() (mean time.Duration, n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nprocs.Store(int64(runtime.GOMAXPROCS(0)))
	metrics.Read(s.sample[:1])
	if s.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0, 0
	}
	h := s.sample[0].Value.Float64Histogram()
	if len(s.last) != len(h.Counts) {
		s.last = make([]uint64, len(h.Counts))
		copy(s.last, h.Counts)
		return 0, 0
	}
	var sum float64
	for i, c := range h.Counts {
		d := c - s.last[i]
		s.last[i] = c
		if d == 0 {
			continue
		}
		lo, hi := h.Buckets[i], h.Buckets[i+1]
		switch {
		case math.IsInf(lo, -1):
			lo = hi
		case math.IsInf(hi, 1):
			hi = lo
		}
		sum += float64(d) * (lo + hi) / 2
		n += d
	}
	if n == 0 {
		return 0, 0
	}
	return time.Duration(sum / float64(n) * 1e9), n
}

// runnable returns the goroutines waiting in Go's run queues now, and
// false when another reading is under way.
func (s *schedDelay) runnable() (uint64, bool) {
	if !s.rmu.TryLock() {
		return 0, false
	}
	defer s.rmu.Unlock()
	metrics.Read(s.sample[1:])
	if s.sample[1].Value.Kind() != metrics.KindUint64 {
		return 0, false
	}
	return s.sample[1].Value.Uint64(), true
}

// procs returns GOMAXPROCS as of the last delay reading.
func (s *schedDelay) procs() uint64 { return uint64(s.nprocs.Load()) }

// runnableSource reads how many goroutines wait in Go's run queues now,
// and how many processors run them: schedDelay, or a test's.
type runnableSource interface {
	runnable() (uint64, bool)
	procs() uint64
}
