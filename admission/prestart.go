package admission

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/criticality"
)

const (
	prestartSlots = 4
	// prestartEpoch is the prestart ring's epoch when queueing delay is
	// measured from Arrive to Start: a request that never reaches Start
	// stops counting after three to four seconds.
	prestartEpoch = int64(time.Second)
)

// hotLine is the counters every request writes. It is 64 bytes, and Go
// allocates a 64-byte object at a multiple of 64: one cache line.
type hotLine struct {
	// executing counts the requests holding an execution slot.
	executing atomic.Int64
	// prestart counts the admitted requests not yet started, per epoch of
	// arrival (a slot of prestartRing) and criticality: four signed 16-bit
	// counts per word, one per level (see slotCount).
	prestart [prestartSlots]atomic.Int64
	// started counts, per criticality, the requests between Start and
	// Done.
	started [criticality.NumLevels]atomic.Int32
	_       [8]byte
}

// levelUnit is one request of level l in a prestart word.
func levelUnit(l criticality.Level) int64 { return 1 << (16 * uint(l)) }

// A prestart word holds four signed 16-bit counts, each added into the
// word at its place, so the word is their weighted sum whatever their
// signs (a count may dip below zero for a moment when a removal races
// with a rotation). Adding slotBias makes every place non-negative, so
// that each count is read with a shift and a mask.
const slotBias = 0x8000_8000_8000_8000

// slotLevel decodes the count of level l from a prestart word.
func slotLevel(w int64, l criticality.Level) int64 {
	return int64((uint64(w)+slotBias)>>(16*uint(l))&0xffff) - 1<<15
}

// slotTotal decodes the sum of a prestart word's four counts.
func slotTotal(w int64) int64 {
	u := uint64(w) + slotBias
	s := u&0x0000_ffff_0000_ffff + u>>16&0x0000_ffff_0000_ffff
	return int64(s&0xffff_ffff+s>>32) - 4<<15
}

// maxSlotCount bounds the requests of one level admitted and not started
// in one epoch, so that a count never leaves its 16 bits (concurrent
// arrivals may each pass the check at once: the margin covers them).
const maxSlotCount = 1<<15 - 1<<11

// prestartRing counts admitted requests that have not reached Start, by
// epoch of arrival and criticality, in four slots of the Controller's hot
// line: counting is one atomic add. A slot four or more epochs old is
// dropped at the first arrival of a new epoch: its requests (their stream
// was reset before the handler ran, or the method is unknown) stop
// counting, towards the pending cap and among their level's not-started
// requests alike, and their level's eviction debt is cut to what is left,
// as it is when a request leaves before Start (Done, Scheduled).
// The slots are the only record of requests not started, so nothing else
// needs correcting when one is dropped.
type prestartRing struct {
	cur    atomic.Int64
	rot    sync.Mutex
	epochs [prestartSlots]atomic.Int64
	counts *[prestartSlots]atomic.Int64
	lv     *[criticality.NumLevels]levelCounters
}

// noEpoch marks a dropped slot.
const noEpoch = math.MinInt64

func (r *prestartRing) init(counts *[prestartSlots]atomic.Int64, lv *[criticality.NumLevels]levelCounters) {
	r.counts, r.lv = counts, lv
	r.cur.Store(math.MinInt64 / 2)
	for i := range r.epochs {
		r.epochs[i].Store(noEpoch)
	}
}

// rotate makes e the current epoch, dropping the slots of epochs four or
// more before it.
func (r *prestartRing) rotate(e int64) {
	r.rot.Lock()
	defer r.rot.Unlock()
	if e <= r.cur.Load() {
		return
	}
	dropped := false
	for i := range r.epochs {
		if ep := r.epochs[i].Load(); ep > e-prestartSlots && ep < e {
			continue
		}
		// Also a dropped slot: an add racing with its drop may have
		// counted there.
		if r.counts[i].Swap(0) != 0 {
			dropped = true
		}
		r.epochs[i].Store(noEpoch)
	}
	r.epochs[e%prestartSlots].Store(e)
	r.cur.Store(e)
	if !dropped {
		return
	}
	for l := range r.lv {
		r.cut(criticality.Level(l))
	}
}

// cut bounds level l's eviction debt by its requests still counted: a
// debt no request left can pay is forgiven, not charged to later ones.
func (r *prestartRing) cut(l criticality.Level) {
	left := max(r.level(l), 0)
	for {
		owed := r.lv[l].owed.Load()
		if owed <= left || r.lv[l].owed.CompareAndSwap(owed, left) {
			return
		}
	}
}

// add counts an arrival of level l in epoch e, or in the current epoch if
// e's slot is gone (a stale clock reading), and returns the epoch it was
// counted in; false if the slot already holds maxSlotCount requests of
// level l. A rotation between the check and the add counts the request in
// the slot's next epoch, where it stops counting an epoch or so late.
func (r *prestartRing) add(e int64, l criticality.Level) (int64, bool) {
	if e > r.cur.Load() {
		r.rotate(e)
	}
	if r.epochs[e%prestartSlots].Load() != e {
		e = r.cur.Load()
	}
	w := &r.counts[e%prestartSlots]
	if slotLevel(w.Load(), l) >= maxSlotCount {
		return 0, false
	}
	w.Add(levelUnit(l))
	return e, true
}

// leave takes out of the slots a request of level l counted in epoch e
// that will not start, with any debt of its level left unpayable.
func (r *prestartRing) leave(e int64, l criticality.Level) {
	r.remove(e, l)
	r.cut(l)
}

// remove takes a request of level l counted in epoch e out of the slots.
// If its slot was dropped meanwhile, it is no longer counted: nothing to
// do.
func (r *prestartRing) remove(e int64, l criticality.Level) {
	if i := e % prestartSlots; r.epochs[i].Load() == e {
		r.counts[i].Add(-levelUnit(l))
	}
}

// total is the requests counted, once the ring is at epoch e.
func (r *prestartRing) total(e int64) int64 {
	if e > r.cur.Load() {
		r.rotate(e)
	}
	var n int64
	for i := range r.counts {
		n += slotTotal(r.counts[i].Load())
	}
	return n
}

// level is the requests of level l counted.
func (r *prestartRing) level(l criticality.Level) int64 {
	var n int64
	for i := range r.counts {
		n += slotLevel(r.counts[i].Load(), l)
	}
	return n
}

// occupancy is the requests admitted and not done: those not yet started
// (arrived within the last three to four seconds), waiting and running.
func (c *Controller) occupancy(now int64) int64 {
	return c.prestart.total(now/c.prestartEpoch) + c.queued.Load() + c.hot.executing.Load() + c.away.Load()
}
