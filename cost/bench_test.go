package cost

import (
	"crypto/sha256"
	"fmt"
	"testing"
)

// burn does n rounds of SHA-256 over 32 bytes: pure CPU.
func burn(n int) byte {
	var b [32]byte
	for range n {
		b = sha256.Sum256(b[:])
	}
	return b[0]
}

// BenchmarkAccounting is a request of the given CPU (sha256 rounds: 200 is
// about 17 µs, the accuracy test's 1x class; 10 about 1 µs) without and
// with the Meter's Begin/End around it: the accounting's share of
// throughput is metered/bare - 1.
func BenchmarkAccounting(b *testing.B) {
	m, err := New()
	if err != nil {
		b.Fatal(err)
	}
	for _, rounds := range []int{200, 10} {
		b.Run(fmt.Sprintf("rounds=%d/bare", rounds), func(b *testing.B) {
			for b.Loop() {
				burn(rounds)
			}
		})
		b.Run(fmt.Sprintf("rounds=%d/metered", rounds), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var r Request
				m.Begin(&r)
				burn(rounds)
				m.End(&r)
			}
		})
	}
}
