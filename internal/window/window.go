// Package window counts events over a trailing time window, for the
// mechanisms of SRE book ch. 21 that are defined as ratios over "the last two
// minutes" (client-side throttling) or over a window (retry budgets).
//
// A Counter counts a pair of event kinds (say, requests and accepts) in
// one 64-bit word per bucket, over a window cut into n buckets kept in a
// ring of n+1 slots. The sums of the complete buckets are frozen into an
// immutable snapshot whenever the ring rotates (once per bucket width), so
// counting an event is one atomic add and reading the windowed counts is a
// few loads, whatever n is; memory is fixed at construction. The oldest
// bucket is weighted by the part of it still inside the window, so the
// counts slide smoothly instead of dropping a whole bucket at a rotation.
//
// A Counter also reports a short trailing window (the last `short` buckets,
// weighted the same way), which callers use to react within seconds.
//
// Time is passed in as nanoseconds on any monotone scale, so the same code
// runs on real and virtual time.
package window

import (
	"math"
	"sync"
	"sync/atomic"
)

// Pair is a count of two event kinds.
type Pair struct{ A, B float64 }

// Counter counts a pair of events over a trailing window. It is safe for
// concurrent use: Add is one atomic add and Sums a few loads; a lock is
// taken once per bucket width, by the first caller to see a new bucket,
// to rotate the ring. Memory is fixed: n+1 words plus one snapshot.
//
// Each kind counts at most 2^32-1 events per bucket (more wraps). An event
// that arrives for the previous bucket after the ring rotated is missing
// from the sums until the next rotation.
type Counter struct {
	width int64 // bucket width, ns
	n     int64 // buckets in the window
	short int64 // buckets in the short window
	slots []atomic.Uint64
	rot   sync.Mutex // held only while rotating
	snap  atomic.Pointer[snapshot]
}

// snapshot holds the sums of the complete buckets as of one rotation.
type snapshot struct {
	epoch  int64 // the newest bucket (ns / width)
	long   [2]int64
	oldest [2]int64 // bucket epoch-n
	short  [2]int64
	edge   [2]int64 // bucket epoch-short
}

// New returns a Counter over n buckets of width ns each, with a short
// window of short buckets. It panics on width <= 0, n < 1 or short outside
// [1, n]: callers validate their configuration first.
func New(width int64, n, short int) *Counter {
	if width <= 0 || n < 1 || short < 1 || short > n {
		panic("window: invalid geometry")
	}
	c := &Counter{width: width, n: int64(n), short: int64(short), slots: make([]atomic.Uint64, n+1)}
	c.snap.Store(&snapshot{epoch: math.MinInt64 / 2})
	return c
}

func (c *Counter) slot(e int64) *atomic.Uint64 {
	size := int64(len(c.slots))
	m := e % size
	if m < 0 {
		m += size
	}
	return &c.slots[m]
}

func unpack(w uint64) [2]int64 { return [2]int64{int64(w & math.MaxUint32), int64(w >> 32)} }

// rotate makes e the newest bucket: it clears the slots of the buckets that
// left the window and freezes the sums of the complete ones.
func (c *Counter) rotate(e int64) *snapshot {
	c.rot.Lock()
	defer c.rot.Unlock()
	old := c.snap.Load()
	if e <= old.epoch {
		return old
	}
	size := int64(len(c.slots))
	from := old.epoch + 1
	if e-from >= size {
		from = e - size + 1
	}
	for x := from; x <= e; x++ {
		c.slot(x).Store(0)
	}
	s := &snapshot{epoch: e}
	for x := e - c.n + 1; x < e; x++ {
		v := unpack(c.slot(x).Load())
		s.long[0] += v[0]
		s.long[1] += v[1]
		if x > e-c.short {
			s.short[0] += v[0]
			s.short[1] += v[1]
		}
	}
	s.oldest = unpack(c.slot(e - c.n).Load())
	s.edge = unpack(c.slot(e - c.short).Load())
	c.snap.Store(s)
	return s
}

// Add counts a events of the first kind and b of the second at time ns.
// An event older than the window is dropped.
func (c *Counter) Add(ns int64, a, b uint32) {
	e := floorDiv(ns, c.width)
	s := c.snap.Load()
	if e > s.epoch {
		s = c.rotate(e)
	} else if e <= s.epoch-c.n {
		return
	}
	c.slot(e).Add(uint64(a) | uint64(b)<<32)
}

// Sums returns the counts over the whole window and over the short window
// ending at ns. A time older than the newest bucket reads as its start.
func (c *Counter) Sums(ns int64) (window, short Pair) {
	e := floorDiv(ns, c.width)
	s := c.snap.Load()
	if e > s.epoch {
		s = c.rotate(e)
	}
	var f float64
	if e < s.epoch {
		e = s.epoch
	} else {
		f = float64(ns-e*c.width) / float64(c.width)
	}
	cur := unpack(c.slot(e).Load())
	g := 1 - f
	window = Pair{
		A: float64(s.long[0]+cur[0]) + g*float64(s.oldest[0]),
		B: float64(s.long[1]+cur[1]) + g*float64(s.oldest[1]),
	}
	short = Pair{
		A: float64(s.short[0]+cur[0]) + g*float64(s.edge[0]),
		B: float64(s.short[1]+cur[1]) + g*float64(s.edge[1]),
	}
	return window, short
}

// Latest returns the first kind's count over the newest k buckets (the
// current one, partly elapsed, and the k-1 before it) and the span they
// cover in ns, ending at ns. k is clamped to [1, n]. It reads k slots.
func (c *Counter) Latest(ns int64, k int) (a float64, span int64) {
	p, span := c.LatestPair(ns, k)
	return p.A, span
}

// LatestPair is Latest for both kinds.
func (c *Counter) LatestPair(ns int64, k int) (p Pair, span int64) {
	k = max(1, min(k, int(c.n)))
	e := floorDiv(ns, c.width)
	s := c.snap.Load()
	if e > s.epoch {
		s = c.rotate(e)
	}
	if e < s.epoch {
		e = s.epoch
		ns = (e + 1) * c.width
	}
	for x := e - int64(k) + 1; x <= e; x++ {
		w := unpack(c.slot(x).Load())
		p.A += float64(w[0])
		p.B += float64(w[1])
	}
	return p, ns - (e-int64(k)+1)*c.width
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && (a < 0) {
		q--
	}
	return q
}
