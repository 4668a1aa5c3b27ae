package admission

import "testing"

// A queue served newest first while its older entries give up (a
// standing queue under adaptive LIFO) holds about twice the requests
// waiting in it, not every request that ever left it.
func TestQueueHoldsAboutItsWaiters(t *testing.T) {
	var q fifo
	var waiting []*waiter
	for i := range 100_000 {
		w := &waiter{}
		q.push(w)
		waiting = append(waiting, w)
		if i%2 == 1 { // one served, the newest
			got := q.popNewest()
			if got != waiting[len(waiting)-1] {
				t.Fatalf("request %d: popNewest gave another than the newest", i)
			}
			waiting = waiting[:len(waiting)-1]
		}
		if len(waiting) > 10 { // the oldest gives up
			waiting[0].leave()
			waiting = waiting[1:]
		}
		if live := len(waiting); len(q.items)-q.head > 2*live+32 {
			t.Fatalf("after %d requests the queue holds %d entries for %d waiting", i+1, len(q.items)-q.head, live)
		}
	}
	for _, w := range waiting {
		w.leave()
	}
	if w := q.pop(); w != nil || q.left != 0 || len(q.items) != 0 {
		t.Fatalf("emptied: pop %v, %d left, %d entries", w, q.left, len(q.items))
	}
}
