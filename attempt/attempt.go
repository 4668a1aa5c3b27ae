// Package attempt carries the per-request attempt counter of SRE book ch. 21,
// "Deciding to Retry": clients put in the request metadata how many times the
// request has already been tried (0 on the first attempt, incremented on
// every retry), and backends keep histograms of the values to tell whether
// other tasks are overloaded too.
//
// The counter is advisory: it feeds histograms and metrics and never raises
// a request's priority. Inbound values are parsed strictly and clamped to
// [0, MaxAttempts].
//
// Two context slots keep the hops apart: the attempt a server received
// (Incoming) is never forwarded; an outgoing call carries the attempt its own
// client set (Outgoing), 0 unless a retry layer says otherwise.
package attempt

import (
	"context"
	"errors"
	"fmt"

	"github.com/triagehq/triage/internal/reqctx"
)

// MaxAttempts is the book's per-request retry budget: "up to three attempts".
// Parsed counters are clamped to [0, MaxAttempts].
const MaxAttempts = 3

// MaxLen is the longest value Parse looks at: two decimal digits.
const MaxLen = 2

// ErrInvalid is returned, wrapped, by Parse for malformed input.
var ErrInvalid = errors.New("attempt: invalid counter")

// Parse reads a counter: one or two ASCII decimal digits, clamped to
// [0, MaxAttempts]. Anything else (empty, sign, space, longer input) yields 0
// and an error wrapping ErrInvalid. It does not allocate.
func Parse(s string) (int, error) {
	if len(s) == 0 || len(s) > MaxLen {
		return 0, invalid(s)
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, invalid(s)
		}
		n = n*10 + int(c-'0')
	}
	return Clamp(n), nil
}

func invalid(s string) error {
	if len(s) > 16 {
		s = s[:16] + "..."
	}
	return fmt.Errorf("%w %q (want 0..%d as decimal digits)", ErrInvalid, s, MaxAttempts)
}

var digits = [...]string{"0", "1", "2", "3"}

// Format writes n, clamped to [0, MaxAttempts]. It does not allocate.
func Format(n int) string { return digits[Clamp(n)] }

// Clamp bounds n to [0, MaxAttempts].
func Clamp(n int) int {
	if n < 0 {
		return 0
	}
	if n > MaxAttempts {
		return MaxAttempts
	}
	return n
}

type outgoingKey struct{}

// NewIncomingContext records the attempt counter a server received. Server
// adapters call it; handlers read it with Incoming.
func NewIncomingContext(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, reqctx.IncomingAttemptKey{}, uint8(Clamp(n)))
}

// Incoming returns the attempt counter of the request being served, 0 if
// none was received.
func Incoming(ctx context.Context) int {
	n, _ := ctx.Value(reqctx.IncomingAttemptKey{}).(uint8)
	return int(n)
}

// NewOutgoingContext sets the counter the next outgoing call carries. Retry
// layers call it with 1, 2, ... before each retry.
func NewOutgoingContext(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, outgoingKey{}, uint8(Clamp(n)))
}

// Outgoing returns the counter an outgoing call made with ctx carries: what
// NewOutgoingContext set, else 0. The Incoming counter is deliberately not
// consulted: a retry at one hop is not a retry at the next.
func Outgoing(ctx context.Context) int {
	n, _ := ctx.Value(outgoingKey{}).(uint8)
	return int(n)
}
