// Package hostport reads the host of a Host header or :authority the one
// way every triage package does: without its port, the brackets of an IPv6
// literal, or a trailing dot. Case is the caller's to fold.
package hostport

import "strings"

// Host returns h without a ":port", the brackets of an IPv6 literal, or a
// trailing dot ("Pay.Example.com.:443" is "Pay.Example.com"). It does not
// allocate.
func Host(h string) string {
	if strings.HasPrefix(h, "[") {
		if i := strings.IndexByte(h, ']'); i > 0 {
			return h[1:i]
		}
		return h
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 && strings.IndexByte(h, ':') == i {
		h = h[:i]
	}
	return strings.TrimSuffix(h, ".")
}
