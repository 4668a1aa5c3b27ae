package edge_test

import (
	"testing"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
)

// FuzzClassify: any request gets a valid level, and an untrusted header
// never decides.
func FuzzClassify(f *testing.F) {
	f.Add(false, "CRITICAL_PLUS", "batch.example.com:80", "/checkout", "premium")
	f.Add(true, "SHEDDABLE", "[::1", "", "")
	f.Add(true, "", "a.b.internal.example.com.", "/static/", "x")
	c := edge.MustNew(frontendRules())
	f.Fuzz(func(t *testing.T, trusted bool, header, host, path, group string) {
		d := c.Classify(&edge.Request{Trusted: trusted, Header: header, Host: host, Path: path, Group: group})
		if !d.Level.Valid() {
			t.Fatalf("invalid level %d", d.Level)
		}
		if !trusted && (d.Rule == edge.Header || d.InvalidHeader) {
			t.Fatalf("untrusted header used: %+v", d)
		}
		if d.Rule == edge.Header {
			if l, err := criticality.Parse(header); err != nil || l != d.Level {
				t.Fatalf("header rule level %v from %q", d.Level, header)
			}
		}
	})
}
