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
