package attempt_test

import (
	"strconv"
	"testing"

	"github.com/triagehq/triage/attempt"
)

// FuzzParse: the result is always within [0, MaxAttempts]; accepted input
// is 1-2 ASCII digits whose value, clamped, is the result.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"0", "2", "99", "-1", "", "1e3", "٣"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := attempt.Parse(s)
		if n < 0 || n > attempt.MaxAttempts {
			t.Fatalf("Parse(%q) = %d out of range", s, n)
		}
		if err != nil {
			if n != 0 {
				t.Fatalf("Parse(%q) failed with %d", s, n)
			}
			return
		}
		v, aerr := strconv.Atoi(s)
		if aerr != nil || len(s) > attempt.MaxLen || s[0] == '+' || s[0] == '-' || attempt.Clamp(v) != n {
			t.Fatalf("Parse(%q) accepted as %d", s, n)
		}
	})
}
