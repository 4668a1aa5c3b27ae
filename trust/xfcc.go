package trust

import (
	"strings"

	"github.com/triagehq/triage/wire"
)

// LastForwardedIdentities returns the identities an x-forwarded-client-cert
// header's last element names: its URI values written as URIs
// (scheme://... or urn:...), then its
// DNS values that have no ':', as Identities orders a certificate's SANs.
// The header is Envoy's format: elements separated by ',', each a list of
// key=value pairs separated by ';', keys case-insensitive, a value holding
// ',', ';' or '=' double-quoted with '"' escaped as '\"'. The last element
// is the one the nearest proxy appended, the only one it vouches for.
//
// A header longer than wire.ForwardedClientCertMaxLen, with an unbalanced
// quote, or whose last element has a pair without '=', names nobody (nil).
// At most 16 identities are returned.
func LastForwardedIdentities(xfcc string) []string {
	if len(xfcc) > wire.ForwardedClientCertMaxLen {
		return nil
	}
	last, ok := lastElement(xfcc)
	if !ok {
		return nil
	}
	var uris, dns []string
	ok = true
	eachTop(last, ';', func(pair string) bool {
		key, value, found := strings.Cut(pair, "=")
		if !found {
			ok = false
			return false
		}
		key = strings.TrimSpace(key)
		if value, found = unquote(strings.TrimSpace(value)); !found {
			ok = false
			return false
		}
		switch {
		case len(uris)+len(dns) == maxForwardedIdentities || checkIdentity(value) != nil:
		case strings.EqualFold(key, "URI") && isURI(value):
			uris = append(uris, value)
		case strings.EqualFold(key, "DNS") && !strings.Contains(value, ":"):
			dns = append(dns, value)
		}
		return true
	})
	if !ok {
		return nil
	}
	return append(uris, dns...)
}

// maxForwardedIdentities bounds what one header element can name.
const maxForwardedIdentities = 16

// lastElement returns what follows the last ',' outside quotes, or false if
// a quote is left open.
func lastElement(s string) (string, bool) {
	last := ""
	balanced := eachTop(s, ',', func(part string) bool { last = part; return true })
	return last, balanced
}

// eachTop calls f with each part of s between seps outside double quotes
// ('\' escaping the next byte inside them) until f returns false, and
// reports whether every quote was closed.
func eachTop(s string, sep byte, f func(string) bool) bool {
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && quoted:
			i++
		case s[i] == '"':
			quoted = !quoted
		case s[i] == sep && !quoted:
			if !f(s[start:i]) {
				return !quoted
			}
			start = i + 1
		}
	}
	f(s[start:])
	return !quoted
}

// unquote returns v without its double quotes and with '\"' and '\\'
// unescaped, or v itself if it is not quoted.
func unquote(v string) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return v, !strings.Contains(v, `"`)
	}
	if v[len(v)-1] != '"' {
		return "", false
	}
	v = v[1 : len(v)-1]
	if !strings.Contains(v, `\`) {
		return v, true
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String(), true
}
