// Package grpcwire reads and writes the parts of gRPC's wire protocol
// (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md) that
// triage's HTTP-level adapters handle themselves: which requests are gRPC,
// the grpc-timeout header, the grpc-message encoding and the
// grpc-retry-pushback-ms trailer.
package grpcwire

import (
	"strconv"
	"strings"
	"time"
)

// IsGRPC reports whether a request's Content-Type says gRPC:
// application/grpc, alone or followed by "+" (a codec, as
// application/grpc+proto) or ";" (parameters), in any letter case. gRPC-Web
// (application/grpc-web, application/grpc-web-text) is not gRPC on the
// wire (its text form is base64, its trailers are in the body): the
// adapters treat it as HTTP. The sidecar, triagehttp and the Envoy
// processor all decide with this.
func IsGRPC(contentType string) bool {
	const p = "application/grpc"
	if len(contentType) < len(p) || !strings.EqualFold(contentType[:len(p)], p) {
		return false
	}
	return len(contentType) == len(p) || contentType[len(p)] == '+' || contentType[len(p)] == ';'
}

// ParseTimeout parses a grpc-timeout header: at most 8 digits and a unit
// (H, M, S, m, u, n). Anything else, an empty value included, is false.
func ParseTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseUint(v[:len(v)-1], 10, 64)
	if err != nil || v[0] == '+' {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	// 8 digits of hours do not fit in a Duration: cap it.
	if max := int64(1<<63-1) / int64(unit); n > uint64(max) {
		return time.Duration(1<<63 - 1), true
	}
	return time.Duration(n) * unit, true
}

// FormatTimeout writes d as a grpc-timeout value: the finest unit whose
// count fits in 8 digits; a deadline already passed is "0n".
func FormatTimeout(d time.Duration) string {
	if d <= 0 {
		return "0n"
	}
	for _, u := range [...]struct {
		d time.Duration
		c byte
	}{{time.Nanosecond, 'n'}, {time.Microsecond, 'u'}, {time.Millisecond, 'm'}, {time.Second, 'S'}, {time.Minute, 'M'}} {
		// Round up, so the upstream's deadline is never earlier than ours
		// by more than the unit.
		n := d / u.d
		if d%u.d != 0 {
			n++
		}
		if n < 1e8 {
			return strconv.FormatInt(int64(n), 10) + string(u.c)
		}
	}
	return strconv.FormatInt(int64(min(d/time.Hour+1, 99999999)), 10) + "H"
}

// EncodeMessage percent-encodes a grpc-message: every byte outside
// printable ASCII, and '%'.
func EncodeMessage(msg string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c >= 0x20 && c <= 0x7e && c != '%' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// RetryPushbackKey is the trailer by which a server tells a client's retry
// policy (gRFC A6) when to retry: a non-negative number of milliseconds,
// or a negative one for "do not retry".
const RetryPushbackKey = "grpc-retry-pushback-ms"

// FormatPushback returns the grpc-retry-pushback-ms value of a refusal:
// "-1" when the caller must not retry, after's milliseconds when the
// server has an opinion of when to retry, "" (send none, the client's
// backoff applies) otherwise.
func FormatPushback(retry bool, after time.Duration) string {
	switch {
	case !retry:
		return "-1"
	case after > 0:
		return strconv.FormatInt(after.Milliseconds(), 10)
	}
	return ""
}
