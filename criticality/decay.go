package criticality

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"
)

// Decay is how a request's criticality falls while it waits: the CRE
// post's "Criticality changes over time". The front page is CRITICAL_PLUS
// for its first 2 s; after that the user has probably gone, and the
// request is worth no more than the lowest bucket. From At on, the
// request's criticality is To (when To is below what it carries).
type Decay struct {
	At time.Time
	To Level
}

type decayKey struct{}

// WithDecay returns a child of ctx whose criticality falls to d.To at
// d.At. Queues and admission decisions that see the context (package
// admission, the adapters' taps) use the current criticality, so requests
// past their usefulness are the first and cheapest load shed; outgoing
// calls carry the decay to the next hop.
func WithDecay(ctx context.Context, d Decay) context.Context {
	return context.WithValue(ctx, decayKey{}, d)
}

// DecayOf returns the decay ctx carries, if any.
func DecayOf(ctx context.Context) (Decay, bool) {
	d, ok := ctx.Value(decayKey{}).(Decay)
	return d, ok
}

// Current returns the criticality of ctx at now: Of(ctx), or the decay's
// level once it has passed (never higher than Of(ctx)). The second result
// says whether the request has decayed.
func Current(ctx context.Context, now time.Time) (Level, bool) {
	l := Of(ctx)
	if d, ok := DecayOf(ctx); ok && !now.Before(d.At) && d.To < l {
		return d.To, true
	}
	return l, false
}

// MaxDecay bounds a decay's delay, on the wire and in configuration.
const MaxDecay = time.Hour

// ErrInvalidDecay is wrapped by ParseDecay's errors.
var ErrInvalidDecay = errors.New("criticality: invalid decay")

// FormatDecay is the wire form of a decay still ahead of now, in the
// triage-criticality-decay header: the milliseconds left (clock skew
// between hops does not matter, as with gRPC's timeout), a colon, and the
// level it falls to: "1850:SHEDDABLE". A decay already past returns "".
func FormatDecay(d Decay, now time.Time) string {
	left := d.At.Sub(now)
	if left <= 0 || !d.To.Valid() {
		return ""
	}
	ms := min((left+time.Millisecond-1)/time.Millisecond, MaxDecay/time.Millisecond)
	return strconv.FormatInt(int64(ms), 10) + ":" + d.To.String()
}

// MaxDecayLen bounds the wire form: 7 digits, a colon and a level name.
const MaxDecayLen = 7 + 1 + MaxNameLen

// ParseDecay reads the wire form written by FormatDecay, received at now:
// 1 to 7 decimal digits (at most MaxDecay in milliseconds), a colon, a
// canonical level name. Anything else is an error wrapping
// ErrInvalidDecay; the request then carries no decay.
func ParseDecay(s string, now time.Time) (Decay, error) {
	if len(s) > MaxDecayLen {
		return Decay{}, ErrInvalidDecay
	}
	i := strings.IndexByte(s, ':')
	if i < 1 || i > 7 {
		return Decay{}, ErrInvalidDecay
	}
	var ms int64
	for _, c := range []byte(s[:i]) {
		if c < '0' || c > '9' {
			return Decay{}, ErrInvalidDecay
		}
		ms = ms*10 + int64(c-'0')
	}
	if time.Duration(ms)*time.Millisecond > MaxDecay {
		return Decay{}, ErrInvalidDecay
	}
	l, err := Parse(s[i+1:])
	if err != nil {
		return Decay{}, ErrInvalidDecay
	}
	return Decay{At: now.Add(time.Duration(ms) * time.Millisecond), To: l}, nil
}
