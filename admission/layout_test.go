package admission

import (
	"testing"
	"unsafe"

	"github.com/triagehq/triage/criticality"
)

// Every counter each request writes sits on one 64-byte line: hotLine is
// exactly 64 bytes (Go allocates such objects at multiples of 64), and a
// Controller's is so aligned.
func TestHotLineIsOneCacheLine(t *testing.T) {
	if n := unsafe.Sizeof(hotLine{}); n != 64 {
		t.Fatalf("hotLine is %d bytes, want 64", n)
	}
	for range 100 {
		c, err := New()
		if err != nil {
			t.Fatal(err)
		}
		if p := uintptr(unsafe.Pointer(c.hot)); p%64 != 0 {
			t.Fatalf("hot line at %#x, not 64-byte aligned", p)
		}
	}
}

// A prestart word decodes into its four counts whatever their signs, and
// the counts stay independent at the bound.
func TestSlotCounts(t *testing.T) {
	for _, want := range [][criticality.NumLevels]int64{
		{}, {1, 2, 3, 4}, {-1, 0, 0, 0}, {0, -1, 5, 0}, {3, 0, -2, -1},
		{maxSlotCount, maxSlotCount, maxSlotCount, maxSlotCount}, {-2048, maxSlotCount, -1, maxSlotCount},
	} {
		var w int64
		for l, n := range want {
			w += n * levelUnit(criticality.Level(l))
		}
		var got [criticality.NumLevels]int64
		var sum int64
		for l, n := range want {
			got[l] = slotLevel(w, criticality.Level(l))
			sum += n
		}
		if got != want || slotTotal(w) != sum {
			t.Errorf("counts %v encode and decode to %v, total %d", want, got, slotTotal(w))
		}
	}
}
