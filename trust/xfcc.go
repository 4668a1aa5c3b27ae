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
	for pair := range splitTop(last, ';') {
		key, value, ok := strings.Cut(pair, "=")
		if !ok {
			return nil
		}
		key = strings.TrimSpace(key)
		if value, ok = unquote(strings.TrimSpace(value)); !ok {
			return nil
		}
		switch {
		case len(uris)+len(dns) == maxForwardedIdentities || checkIdentity(value) != nil:
		case strings.EqualFold(key, "URI") && isURI(value):
			uris = append(uris, value)
		case strings.EqualFold(key, "DNS") && !strings.Contains(value, ":"):
			dns = append(dns, value)
		}
	}
	return append(uris, dns...)
}

// maxForwardedIdentities bounds what one header element can name.
const maxForwardedIdentities = 16

// lastElement returns what follows the last ',' outside quotes, or false if
// a quote is left open.
func lastElement(s string) (string, bool) {
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && quoted:
			i++
		case s[i] == '"':
			quoted = !quoted
		case s[i] == ',' && !quoted:
			start = i + 1
		}
	}
	return s[start:], !quoted
}

// splitTop yields the parts of s between seps outside quotes.
func splitTop(s string, sep byte) func(func(string) bool) {
	return func(yield func(string) bool) {
		start, quoted := 0, false
		for i := 0; i < len(s); i++ {
			switch {
			case s[i] == '\\' && quoted:
				i++
			case s[i] == '"':
				quoted = !quoted
			case s[i] == sep && !quoted:
				if !yield(s[start:i]) {
					return
				}
				start = i + 1
			}
		}
		yield(s[start:])
	}
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
