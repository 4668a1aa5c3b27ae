package criticality_test

import (
	"testing"

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
