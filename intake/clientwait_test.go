package intake

import "testing"

// A goroutine done with the client leaves the set whose waits decide a
// stall, and the others keep their waiting bits: with its own goroutine
// and the one left both waiting, the request is idle on its client.
func TestClientWaitsForgetKeepsTheOthersBits(t *testing.T) {
	var c clientWaits
	for _, g := range []uint64{11, 12, 13} {
		if _, ok := c.bit(g); !ok {
			t.Fatal("three goroutines refused")
		}
	}
	b13, _ := c.bit(13)
	c.waiting = 1 | b13 // its own and 13 wait; 11 and 12 read their bodies to the end
	if c.idle() {
		t.Fatal("idle while 11 and 12 are still seen")
	}
	if !c.forget(12) || !c.forget(11) {
		t.Fatal("forget missed a goroutine it had seen")
	}
	if c.forget(99) {
		t.Error("forgot a goroutine never seen")
	}
	if !c.idle() || c.n != 1 || c.others[0] != 13 {
		t.Errorf("after forgetting 11 and 12: idle %v, n %d, others %v, waiting %b", c.idle(), c.n, c.others, c.waiting)
	}
	if b, _ := c.bit(13); c.waiting&b == 0 {
		t.Errorf("13's wait was lost: waiting %b, its bit %b", c.waiting, b)
	}
}
