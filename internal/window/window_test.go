package window

import (
	"math"
	"sync"
	"testing"
)

const sec = int64(1e9)

func TestCountsInsideTheWindow(t *testing.T) {
	c := New(sec, 10, 2)
	for i := int64(0); i < 10; i++ {
		c.Add(i*sec, 1, uint32(i%2)) // one event at the start of each second
	}
	// At t=10s the window is [0s, 10s]: the event at 0s sits at the very
	// start of the oldest bucket, which is weighted by how much of it is
	// still inside: all of it.
	w, s := c.Sums(10 * sec)
	if w.A != 10 || w.B != 5 || s.A != 2 || s.B != 1 {
		// short window [8s, 10s]: events at 8s and 9s; bucket 10 is empty.
		t.Fatalf("Sums(10s) = %+v, %+v; want {10 5}, {2 1}", w, s)
	}
	w, s = c.Sums(10*sec + sec/2)
	if math.Abs(w.A-9.5) > 1e-9 || math.Abs(s.A-1.5) > 1e-9 {
		t.Fatalf("Sums(10.5s) = %+v, %+v; want A 9.5 and 1.5 (half of the oldest buckets aged out)", w, s)
	}
	w, _ = c.Sums(20 * sec)
	if w.A != 0 || w.B != 0 {
		t.Fatalf("Sums(20s) = %+v, want 0", w)
	}
}

// The count never drops by a whole bucket at once: sampled every 10 ms
// under a steady rate, it moves by at most the events of one sampling step
// plus the aged-out part of one.
func TestAgesOutSmoothly(t *testing.T) {
	c := New(sec, 12, 3)
	const step = sec / 100 // 100 events per second
	prev, prevShort := -1.0, -1.0
	for ns := int64(0); ns < 60*sec; ns += step {
		c.Add(ns, 1, 1)
		w, s := c.Sums(ns)
		if ns > 13*sec {
			if math.Abs(w.A-1200) > 2 || math.Abs(s.B-300) > 2 {
				t.Fatalf("at %dms the windowed counts are %v and %v, want about 1200 and 300", ns/1e6, w.A, s.B)
			}
			if math.Abs(w.A-prev) > 2 || math.Abs(s.B-prevShort) > 2 {
				t.Fatalf("at %dms a count jumped: %v -> %v, %v -> %v", ns/1e6, prev, w.A, prevShort, s.B)
			}
		}
		prev, prevShort = w.A, s.B
	}
}

func TestIdleGapClearsEverything(t *testing.T) {
	c := New(sec, 4, 1)
	for i := 0; i < 100; i++ {
		c.Add(int64(i)*sec/100, 1, 1)
	}
	c.Add(1000*sec, 1, 0)
	w, s := c.Sums(1000 * sec)
	if w != (Pair{1, 0}) || s != (Pair{1, 0}) {
		t.Fatalf("after an idle gap Sums = %+v, %+v; want {1 0} twice", w, s)
	}
}

func TestLateEventsCountInTheirBucketOrAreDropped(t *testing.T) {
	c := New(sec, 4, 1)
	c.Add(3*sec, 1, 0)
	c.Add(3*sec+1, 0, 1)
	if w, _ := c.Sums(3 * sec); w != (Pair{1, 1}) {
		t.Fatalf("Sums = %+v, want {1 1}", w)
	}
	c.Add(-10*sec, 5, 5) // older than the window
	c.Add(sec, 1, 0)     // inside the window, after the rotation to 3 s
	if w, _ := c.Sums(4 * sec); w != (Pair{2, 1}) {
		t.Fatalf("Sums = %+v, want {2 1}: the late event is in the sums after the next rotation, the ancient one never", w)
	}
	if w, _ := c.Sums(2 * sec); w != (Pair{2, 1}) {
		t.Fatalf("a read at an older time: %+v", w)
	}
}

func TestConcurrentAddsAreAllCounted(t *testing.T) {
	c := New(sec, 8, 2)
	var wg sync.WaitGroup
	const workers, per = 8, 2000
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				c.Add(int64(i)*sec/per*4, 1, 1) // spread over 4 s: rotations happen concurrently
			}
		}()
	}
	wg.Wait()
	w, _ := c.Sums(5 * sec) // rotating freezes every late event
	if w.A != workers*per || w.B != workers*per {
		t.Fatalf("counted %+v, want %d each", w, workers*per)
	}
}

func TestNewRejectsBadGeometry(t *testing.T) {
	for _, g := range [][3]int64{{0, 1, 1}, {1, 0, 1}, {1, 2, 0}, {1, 2, 3}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New(%v) did not panic", g)
				}
			}()
			New(g[0], int(g[1]), int(g[2]))
		}()
	}
}

// Latest counts the newest k buckets, the current one partly elapsed, and
// says how long a span that is.
func TestLatest(t *testing.T) {
	c := New(sec, 10, 3)
	for i := int64(0); i < 10; i++ {
		c.Add(i*sec, uint32(i), 0) // i events at the start of second i
	}
	if a, span := c.Latest(9*sec+sec/2, 2); a != 8+9 || span != sec+sec/2 {
		t.Fatalf("Latest(9.5s, 2) = %v over %v ns; want 17 over 1.5 s", a, span)
	}
	if a, span := c.Latest(9*sec, 1); a != 9 || span != 0 {
		t.Fatalf("Latest(9s, 1) = %v over %v ns", a, span)
	}
	if a, _ := c.Latest(9*sec, 50); a != 45 { // clamped to the window
		t.Fatalf("Latest(9s, 50) = %v, want 45", a)
	}
	if a, span := c.Latest(30*sec, 2); a != 0 || span != sec {
		t.Fatalf("after an idle gap: %v over %v ns", a, span)
	}
}
