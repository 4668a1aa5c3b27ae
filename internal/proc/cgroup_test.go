package proc

import "testing"

func TestParseCPUMax(t *testing.T) {
	for in, want := range map[string]float64{
		"150000 100000\n": 1.5,
		"50000 100000":    0.5,
		"max 100000":      0,
		"":                0,
		"x 100000":        0,
		"100000 0":        0,
		"-1 100000":       0,
		"1 2 3":           0,
		"NaN 100000":      0,
		"Inf 100000":      0,
	} {
		got, ok := ParseCPUMax(in)
		if ok != (want > 0) || got != want {
			t.Errorf("ParseCPUMax(%q) = %v, %v; want %v", in, got, ok, want)
		}
	}
}

func TestParseRunDelay(t *testing.T) {
	for in, want := range map[string]int64{
		"4303465 2985904 3\n": 2985904,
		"1 0 0":               0,
		"":                    -1,
		"1 2":                 -1,
		"1 -2 3":              -1,
		"1 x 3":               -1,
		"1 2 3 4":             -1,
	} {
		got, ok := ParseRunDelay([]byte(in))
		if ok != (want >= 0) || ok && got != want {
			t.Errorf("ParseRunDelay(%q) = %v, %v; want %v", in, got, ok, want)
		}
	}
}

// The demand signal reads this once per half interval on the request
// path of whichever request revisits the controller.
func BenchmarkRunQueueWait(b *testing.B) {
	var w RunQueueWaiter
	if _, err := w.Read(); err != nil {
		b.Skip("no schedstat here:", err)
	}
	b.ReportAllocs()
	for b.Loop() {
		w.Read()
	}
}

// Every reading sees every live thread: the sum over the threads, read
// again, never falls below the first (no thread of this test exits), and
// a thread that waited is in it.
func TestRunQueueWaiterReadsEveryThread(t *testing.T) {
	var w RunQueueWaiter
	a, err := w.Read()
	if err != nil {
		t.Skip("no schedstat here:", err)
	}
	if len(w.files) == 0 {
		t.Fatal("no thread listed")
	}
	for i := 0; i < 2*relistEvery; i++ {
		b, err := w.Read()
		if err != nil || b < a {
			t.Fatalf("reading %d: %v, %v after %v", i, b, err, a)
		}
		a = b
	}
}

func BenchmarkCPU(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		CPU()
	}
}
