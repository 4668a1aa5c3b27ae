package sim

import "testing"

// headlineValue returns the value of r's headline called name, failing
// the test when there is none.
func headlineValue(t *testing.T, r *Result, name string) float64 {
	t.Helper()
	h, ok := r.Headline(name)
	if !ok {
		t.Fatalf("no headline %q", name)
	}
	return h.Value
}
