package outcome_test

import (
	"testing"
	"time"

	"github.com/triagehq/triage/outcome"
)

func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"task-overloaded", "out-of-quota", "success", "", "TASK-OVERLOADED"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, ok := outcome.ParseToken(s)
		if ok && (!k.Overload() || k.Token() != s) {
			t.Fatalf("ParseToken(%q) = %v", s, k)
		}
		if !ok && k != outcome.Failure {
			t.Fatalf("ParseToken(%q) refused but returned %v", s, k)
		}
	})
}

func FuzzParseRetryAfterSeconds(f *testing.F) {
	for _, s := range []string{"0", "120", "999999", "-1", "1.5", "Wed, 21 Oct 2015 07:28:00 GMT"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := outcome.ParseRetryAfterSeconds(s)
		if d < 0 || d > outcome.MaxRetryAfter {
			t.Fatalf("ParseRetryAfterSeconds(%q) = %v out of range", s, d)
		}
		if !ok && d != 0 {
			t.Fatalf("refused %q but returned %v", s, d)
		}
		if ok {
			back, ok2 := outcome.ParseRetryAfterSeconds(outcome.FormatRetryAfterSeconds(d))
			if !ok2 || back != d.Truncate(time.Second) {
				t.Fatalf("round trip of %v gave %v", d, back)
			}
		}
	})
}
