package clock

import (
	"sort"
	"sync"
	"time"
)

// Fake is a Clock that moves only when told to, for tests and the simulator.
// Timers fire, in order of their deadlines, while Advance or Set passes
// them, on the goroutine that calls it. A timer made or reset with d <= 0
// fires at once, with the other timers due, on the goroutine that made
// or reset it; one made or reset for later never fires another timer on
// that goroutine, so code may set a timer under a lock its func takes.
//
// The zero value is not usable; call NewFake. A Fake is safe for concurrent
// use. It holds one entry per pending timer and nothing else; stopped and
// fired timers are dropped.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer
	changed chan struct{} // closed and replaced when a timer is scheduled
}

// NewFake returns a Fake clock that reads start.
func NewFake(start time.Time) *Fake { return &Fake{now: start, changed: make(chan struct{})} }

// BlockUntil waits until at least n timers are pending, or done is closed;
// it reports whether the timers arrived. Tests use it to wait, without
// sleeping, for the code under test to start waiting on the clock before
// they Advance it.
func (f *Fake) BlockUntil(n int, done <-chan struct{}) bool {
	for {
		f.mu.Lock()
		if len(f.timers) >= n {
			f.mu.Unlock()
			return true
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-done:
			return false
		}
	}
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the fake time reaches Now()+d.
// A timer with d <= 0 fires at once.
func (f *Fake) NewTimer(d time.Duration) Timer {
	return f.start(&fakeTimer{f: f, c: make(chan time.Time, 1)}, d)
}

// AfterFunc returns a timer that calls f when the fake time reaches
// Now()+d, on the goroutine that moves it there (Advance or Set), after
// the earlier timers. Its C is nil.
func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	return f.start(&fakeTimer{f: f, fn: fn}, d)
}

// start schedules t d from now, firing it at once if it is due.
func (f *Fake) start(t *fakeTimer, d time.Duration) Timer {
	f.mu.Lock()
	t.when = f.now.Add(d)
	f.schedule(t)
	f.mu.Unlock()
	if d <= 0 {
		f.fireDue()
	}
	return t
}

// Advance moves the fake time forward by d and fires every timer it passes.
func (f *Fake) Advance(d time.Duration) {
	if d < 0 {
		d = 0
	}
	f.mu.Lock()
	target := f.now.Add(d)
	f.mu.Unlock()
	f.Set(target)
}

// Set moves the fake time to t (never backwards) and fires every timer it
// passes, each with its own deadline as the fire time.
func (f *Fake) Set(t time.Time) {
	for {
		f.mu.Lock()
		if len(f.timers) == 0 || f.timers[0].when.After(t) {
			if t.After(f.now) {
				f.now = t
			}
			f.mu.Unlock()
			return
		}
		next := f.timers[0]
		f.timers = f.timers[1:]
		next.pending = false
		if next.when.After(f.now) {
			f.now = next.when
		}
		when := next.when
		f.mu.Unlock()
		if next.fn != nil {
			next.fn()
			continue
		}
		select {
		case next.c <- when:
		default:
		}
	}
}

// Pending returns the number of timers that have not fired or been stopped.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

func (f *Fake) fireDue() { f.Set(f.Now()) }

// schedule inserts t in deadline order; f.mu is held.
func (f *Fake) schedule(t *fakeTimer) {
	i := sort.Search(len(f.timers), func(i int) bool { return f.timers[i].when.After(t.when) })
	f.timers = append(f.timers, nil)
	copy(f.timers[i+1:], f.timers[i:])
	f.timers[i] = t
	t.pending = true
	if f.changed != nil {
		close(f.changed)
		f.changed = make(chan struct{})
	}
}

// unschedule removes t; f.mu is held. It reports whether t was pending.
func (f *Fake) unschedule(t *fakeTimer) bool {
	if !t.pending {
		return false
	}
	for i, x := range f.timers {
		if x == t {
			f.timers = append(f.timers[:i], f.timers[i+1:]...)
			break
		}
	}
	t.pending = false
	return true
}

type fakeTimer struct {
	f       *Fake
	c       chan time.Time // nil for AfterFunc
	fn      func()         // AfterFunc's
	when    time.Time
	pending bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return t.f.unschedule(t)
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	was := t.f.unschedule(t)
	t.when = t.f.now.Add(d)
	t.f.schedule(t)
	t.f.mu.Unlock()
	if d <= 0 {
		t.f.fireDue()
	}
	return was
}
