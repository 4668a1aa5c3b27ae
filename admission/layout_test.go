package admission

import (
	"testing"
	"unsafe"
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

// The packed occupancy decodes both counts, also a negative not-started
// count (which the counting never produces; levelOccupancy clamps it
// anyway) without corrupting the started count.
func TestUnpackOcc(t *testing.T) {
	for _, tc := range []struct{ ns, st int64 }{{0, 0}, {3, 5}, {-1, 2}, {-7, 0}, {1 << 20, 1 << 20}} {
		v := tc.st*oneStarted + tc.ns*oneNotStarted
		if ns, st := unpackOcc(v); ns != tc.ns || st != tc.st {
			t.Fatalf("pack(%d, %d) unpacks to (%d, %d)", tc.ns, tc.st, ns, st)
		}
	}
}
