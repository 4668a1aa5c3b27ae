package signals

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/internal/proc"
)

// ExecutorLoad is the book's "executor load average": the number of
// goroutines running or ready to run (runtime/metrics
// /sched/goroutines/running and /sched/goroutines/runnable), smoothed with
// exponential decay over Tau, as a fraction of the processors available
// (GOMAXPROCS by default). "An incoming request that has a very large
// fan-out ... will cause the load to spike very briefly, but the smoothing
// will mostly swallow that spike. However, if the operations are not
// short-lived ... the task will start rejecting requests."
//
// It is sampled at most once per Interval, on the request path; each sample
// weighs at most two intervals' worth, so a reading taken during a brief
// burst after an idle spell cannot count as if it had lasted the whole
// spell.
//
// In a Go server every CPU-bound request in progress is itself a runnable
// goroutine, so this signal reads above 1 whenever the task is saturated,
// however well the concurrency limit keeps latency; it is not in the
// default set. Use it to shed on load the requests do not account for
// (background work, fan-out that outlives requests).
type ExecutorLoad struct {
	// Procs is the processors available; 0 means runtime.GOMAXPROCS(0).
	Procs float64
	// Tau is the decay time constant; 0 means 1 s.
	Tau time.Duration
	// Interval is the sampling interval; 0 means 1 ms.
	Interval time.Duration
	// Clock is the clock; nil means clock.Real().
	Clock clock.Clock
	// Read returns the current running + runnable goroutines; nil reads
	// runtime/metrics. Tests and the simulator inject it.
	Read func() float64
}

// Signal returns the signal.
func (e ExecutorLoad) Signal() Signal {
	procs := e.Procs
	if procs <= 0 {
		procs = float64(runtime.GOMAXPROCS(0))
	}
	tau := e.Tau
	if tau <= 0 {
		tau = time.Second
	}
	interval := e.Interval
	if interval <= 0 {
		interval = time.Millisecond
	}
	read := e.Read
	if read == nil {
		read = newSchedReader().read
	}
	var (
		mu   sync.Mutex
		load float64
		last time.Time
	)
	return Sampled("executor_load", interval, e.Clock, func(now time.Time) float64 {
		x := read()
		mu.Lock()
		defer mu.Unlock()
		if last.IsZero() {
			load = x
		} else {
			dt := min(now.Sub(last), 2*interval)
			alpha := 1 - math.Exp(-float64(dt)/float64(tau))
			load += alpha * (x - load)
		}
		last = now
		return load / procs
	})
}

// schedReader reads running + runnable goroutines.
type schedReader struct {
	mu      sync.Mutex
	samples []metrics.Sample
}

func newSchedReader() *schedReader {
	return &schedReader{samples: []metrics.Sample{
		{Name: "/sched/goroutines/running:goroutines"},
		{Name: "/sched/goroutines/runnable:goroutines"},
	}}
}

func (r *schedReader) read() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	metrics.Read(r.samples)
	total := 0.0
	for _, s := range r.samples {
		if s.Value.Kind() == metrics.KindUint64 {
			total += float64(s.Value.Uint64())
		}
	}
	return total
}

// CPU is the CPU utilization of this process: its CPU time rate (user +
// system, from getrusage) divided by the CPUs reserved for it: the cgroup
// v2 cpu.max quota when there is one, else GOMAXPROCS. It is sampled at
// most once per Interval (default 100 ms) and is the rate over the last
// interval. Not the machine's CPU, nor the whole cgroup's
// (docs/rationale.md, "Whose CPU").
type CPU struct {
	// CPUs is the CPUs reserved; 0 means ReservedCPUs().
	CPUs float64
	// Interval is the sampling interval; 0 means 100 ms.
	Interval time.Duration
	// Clock is the clock; nil means clock.Real().
	Clock clock.Clock
	// Read returns the process's CPU time so far; nil reads getrusage.
	Read func() (time.Duration, error)
}

// Signal returns the signal, or an error if the platform cannot read the
// process's CPU time.
func (c CPU) Signal() (Signal, error) {
	read := c.Read
	if read == nil {
		read = proc.CPU
	}
	return cpuRate("cpu", c.CPUs, c.Interval, c.Clock, read)
}

// CPUDemand is the CPU this process wanted, against its reservation: its
// CPU time (as CPU) plus the time its threads were runnable and waited
// for a CPU the kernel gave to another process (Linux's per-thread
// schedstat run delay). Where a neighbour on the same cores, or CPUs fewer
// than GOMAXPROCS, keep the process from its reservation, CPU reads below
// 1 while work waits; CPUDemand still reads 1. Time the hypervisor steals
// and interrupt time are counted by neither. Without schedstat it reads
// as CPU. Its fields are CPU's, except that Read returns CPU time plus
// run-queue wait (nil reads getrusage and schedstat). Sampled at most
// once per Interval (default 100 ms), as the rate over the last interval.
// admission.WithSaturation's default.
type CPUDemand CPU

// Signal returns the signal, or an error if the platform cannot read the
// process's CPU time.
func (c CPUDemand) Signal() (Signal, error) {
	read := c.Read
	if read == nil {
		read = demand()
	}
	return cpuRate("cpu_demand", c.CPUs, c.Interval, c.Clock, read)
}

// demand reads CPU time plus run-queue wait. The wait of a thread that
// exited leaves the sum, so the wait is made monotonic here: a reading
// below the last adds nothing.
func demand() func() (time.Duration, error) {
	var mu sync.Mutex
	var lastWait, waited time.Duration
	var wait proc.RunQueueWaiter
	return func() (time.Duration, error) {
		used, err := proc.CPU()
		if err != nil {
			return 0, err
		}
		w, err := wait.Read()
		if err != nil {
			return used, nil
		}
		mu.Lock()
		defer mu.Unlock()
		if w > lastWait {
			waited += w - lastWait
		}
		lastWait = w
		return used + waited, nil
	}
}

// cpuRate is the rate of read's time over wall time, against cpus,
// sampled at most once per interval.
func cpuRate(name string, cpus float64, interval time.Duration, clk clock.Clock, read func() (time.Duration, error)) (Signal, error) {
	if cpus <= 0 {
		cpus = ReservedCPUs()
	}
	if interval <= 0 {
		interval = 100 * time.Millisecond
	}
	if _, err := read(); err != nil {
		return nil, err
	}
	var (
		mu       sync.Mutex
		lastCPU  time.Duration
		lastWall time.Time
		value    float64
	)
	return Sampled(name, interval, clk, func(now time.Time) float64 {
		used, err := read()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			return value
		}
		if !lastWall.IsZero() && now.After(lastWall) {
			value = float64(used-lastCPU) / float64(now.Sub(lastWall)) / cpus
		}
		lastCPU, lastWall = used, now
		return value
	}), nil
}

// ReservedCPUs returns the CPUs reserved for this process: the cgroup v2
// cpu.max quota divided by its period when a quota is set, else
// GOMAXPROCS.
func ReservedCPUs() float64 {
	if q, ok := proc.CgroupCPUs(); ok {
		return q
	}
	return float64(runtime.GOMAXPROCS(0))
}

// Memory is memory pressure: the memory the Go runtime holds from the
// system (runtime/metrics /memory/classes/total minus released heap)
// against the limit: the Go memory limit (debug.SetMemoryLimit, GOMEMLIMIT)
// or the cgroup v2 memory.max, whichever is lower. With neither set it
// reads 0. Sampled at most once per Interval (default 100 ms).
type Memory struct {
	// Limit in bytes; 0 means MemoryLimit().
	Limit uint64
	// Interval is the sampling interval; 0 means 100 ms.
	Interval time.Duration
	// Clock is the clock; nil means clock.Real().
	Clock clock.Clock
	// Read returns the bytes in use; nil reads runtime/metrics.
	Read func() uint64
}

// Signal returns the signal.
func (m Memory) Signal() Signal {
	limit := m.Limit
	if limit == 0 {
		limit = MemoryLimit()
	}
	interval := m.Interval
	if interval <= 0 {
		interval = 100 * time.Millisecond
	}
	read := m.Read
	if read == nil {
		read = newMemReader().read
	}
	return Sampled("memory", interval, m.Clock, func(time.Time) float64 {
		if limit == 0 || limit == math.MaxInt64 {
			return 0
		}
		return float64(read()) / float64(limit)
	})
}

// MemoryLimit returns the lower of the Go memory limit and the cgroup v2
// memory.max, or 0 if neither is set.
func MemoryLimit() uint64 {
	limit := uint64(0)
	if l := debug.SetMemoryLimit(-1); l > 0 && l != math.MaxInt64 {
		limit = uint64(l)
	}
	if v, ok := proc.CgroupMemory(); ok && (limit == 0 || v < limit) {
		limit = v
	}
	return limit
}

type memReader struct {
	mu      sync.Mutex
	samples []metrics.Sample
}

func newMemReader() *memReader {
	return &memReader{samples: []metrics.Sample{
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
	}}
}

func (r *memReader) read() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	metrics.Read(r.samples)
	if r.samples[0].Value.Kind() != metrics.KindUint64 || r.samples[1].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return r.samples[0].Value.Uint64() - r.samples[1].Value.Uint64()
}
