package criticality_test

import (
	"errors"
	"testing"
	"time"

	"github.com/triagehq/triage/criticality"
)

// FuzzParse: any input gives a valid level; an accepted input is exactly the
// level's canonical name; a refused one gives Default.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"CRITICAL", "SHEDDABLE_PLUS", "", "critical", "CRITICAL,CRITICAL"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := criticality.Parse(s)
		if !l.Valid() {
			t.Fatalf("Parse(%q) returned invalid level %d", s, l)
		}
		if err == nil && l.String() != s {
			t.Fatalf("Parse(%q) accepted a non-canonical name as %v", s, l)
		}
		if err != nil && l != criticality.Default {
			t.Fatalf("Parse(%q) failed but returned %v, not Default", s, l)
		}
	})
}

// FuzzParseDecay: any input either fails with ErrInvalidDecay or gives a
// decay at most MaxDecay ahead whose wire form reads back the same.
func FuzzParseDecay(f *testing.F) {
	for _, s := range []string{"1850:SHEDDABLE", "0:CRITICAL", "3600000:SHEDDABLE_PLUS", "3600001:SHEDDABLE", ":SHEDDABLE", "12:", "-5:SHEDDABLE", "1e3:SHEDDABLE", "5:sheddable", "00000001:SHEDDABLE"} {
		f.Add(s)
	}
	now := time.Unix(1e9, 0)
	f.Fuzz(func(t *testing.T, s string) {
		d, err := criticality.ParseDecay(s, now)
		if err != nil {
			if !errors.Is(err, criticality.ErrInvalidDecay) || d != (criticality.Decay{}) {
				t.Fatalf("ParseDecay(%q) = %v, %v", s, d, err)
			}
			return
		}
		if left := d.At.Sub(now); left < 0 || left > criticality.MaxDecay || !d.To.Valid() {
			t.Fatalf("ParseDecay(%q) = %v left, level %d", s, left, d.To)
		}
		if w := criticality.FormatDecay(d, now); d.At.After(now) {
			back, err := criticality.ParseDecay(w, now)
			if err != nil || back != d {
				t.Fatalf("ParseDecay(%q) = %v, written %q, read back %v, %v", s, d, w, back, err)
			}
		} else if w != "" {
			t.Fatalf("a decay already past is written %q", w)
		}
	})
}
