package isolate_test

import (
	"strings"
	"testing"
)

// FuzzClientFor looks up arbitrary Host headers: never a panic, and the
// same client type whatever the case, port or trailing dot (the forms a
// caller can choose to dodge a client type's route).
func FuzzClientFor(f *testing.F) {
	for _, h := range []string{"maps.api.example.com", "MAPS.api.example.com.:443", "[::1]:80", "spam.api.example.com:", ":", "[", "rogue.api.example.com.."} {
		f.Add(h)
	}
	tb := table(f)
	f.Fuzz(func(t *testing.T, host string) {
		got := tb.ClientFor(host)
		_ = tb.RouteOf(got)
		if strings.ContainsAny(host, "[]:") {
			return // already carries a port or brackets
		}
		upper := strings.Map(func(r rune) rune { // ASCII only, as hostnames fold
			if r >= 'a' && r <= 'z' {
				return r - 'a' + 'A'
			}
			return r
		}, host)
		for _, v := range []string{upper, host + ":443", host + ".", upper + ".:8443"} {
			if c := tb.ClientFor(v); c != got {
				t.Fatalf("ClientFor(%q) = %q but ClientFor(%q) = %q", host, got, v, c)
			}
		}
	})
}
