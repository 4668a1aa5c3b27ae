package triagegrpc_test

import "testing"

// A refusal at the tap is the path an overloaded server takes ten times
// for every request it serves: it allocates nothing.
func TestTapRefusalAllocatesNothing(t *testing.T) {
	h, ctx, info := fullTap(t)
	admitted := 0
	n := testing.AllocsPerRun(1000, func() {
		if _, err := h(ctx, info); err == nil {
			admitted++
		}
	})
	if admitted > 0 {
		t.Fatalf("a full controller admitted %d of 1,001 requests", admitted)
	}
	if n != 0 {
		t.Errorf("a refusal at the tap allocates %.0f times", n)
	}
}
