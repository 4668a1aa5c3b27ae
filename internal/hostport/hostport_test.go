package hostport

import "testing"

func TestHost(t *testing.T) {
	for in, want := range map[string]string{
		"example.com":       "example.com",
		"example.com:443":   "example.com",
		"example.com.":      "example.com",
		"Example.COM.:8443": "Example.COM",
		"[::1]:443":         "::1",
		"[::1]":             "::1",
		"[::1":              "[::1",
		"::1":               "::1", // a bare IPv6 literal keeps its colons
		"":                  "",
		"10.0.0.1:80":       "10.0.0.1",
		"host:port:extra":   "host:port:extra",
	} {
		if got := Host(in); got != want {
			t.Errorf("Host(%q) = %q, want %q", in, got, want)
		}
	}
}
