// Package outcome defines the overload outcomes every triage layer
// understands, beside success and ordinary failure.
//
// SRE book ch. 21, "Handling Overload Errors" and "Deciding to Retry":
//   - TaskOverloaded: this task is overloaded; the request is likely to
//     succeed on another task, so the layer directly above retries it
//     (within its budgets).
//   - DontRetry: "overloaded; don't retry". The datacenter is likely
//     overloaded, or the retry budgets are spent; the error bubbles up and no
//     layer retries, which prevents the combinatorial retry explosion of
//     deep stacks (Figure 21-2).
//   - OutOfQuota: the customer has used its quota ("Per-Customer Limits");
//     retry after RetryAfter, not sooner.
//
// Errors are *Error values; errors.Is matches them against the sentinels
// ErrTaskOverloaded, ErrDontRetry and ErrOutOfQuota, and Classify maps any
// error to a Kind. A rejection made by the caller's own process (client-side
// throttling) has Local set, so it stays distinct from a rejection by the
// backend. The transport mappings (gRPC status codes and details, HTTP
// statuses and headers) live in the adapters; this package imports only the
// standard library.
package outcome

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// Kind classifies the outcome of a request.
type Kind uint8

const (
	// Success is a request that succeeded (a nil error).
	Success Kind = iota
	// Failure is any error that is not an overload outcome.
	Failure
	// TaskOverloaded means the task that answered is overloaded; retrying on
	// another task is likely to succeed.
	TaskOverloaded
	// DontRetry means "overloaded; don't retry": the caller must not retry
	// and should pass the same outcome up.
	DontRetry
	// OutOfQuota means the customer is over its quota; retry after the
	// error's RetryAfter.
	OutOfQuota
)

// NumKinds is the number of kinds; a Kind indexes a [NumKinds]T array.
const NumKinds = 5

var tokens = [NumKinds]string{"success", "failure", "task-overloaded", "overloaded-dont-retry", "out-of-quota"}

// Token returns the kind's stable wire and metric name, e.g.
// "task-overloaded". It is what the HTTP adapter writes in the
// triage-outcome header.
func (k Kind) Token() string {
	if k < NumKinds {
		return tokens[k]
	}
	return "unknown"
}

func (k Kind) String() string { return k.Token() }

// Overload reports whether k is one of the three overload outcomes.
func (k Kind) Overload() bool { return k >= TaskOverloaded && k < NumKinds }

// Retriable reports whether the layer directly above may retry: only
// TaskOverloaded is.
func (k Kind) Retriable() bool { return k == TaskOverloaded }

// ParseToken returns the overload kind whose Token is s. Only the three
// overload tokens are accepted; anything else returns false.
func ParseToken(s string) (Kind, bool) {
	if len(s) > 32 {
		return Failure, false
	}
	for k := TaskOverloaded; k < NumKinds; k++ {
		if tokens[k] == s {
			return k, true
		}
	}
	return Failure, false
}

// Error is an overload outcome. Create one with New or the constructors; the
// zero value is not meaningful. Errors are immutable once returned.
type Error struct {
	// Kind is TaskOverloaded, DontRetry or OutOfQuota.
	Kind Kind
	// RetryAfter is how long the caller should wait before trying again;
	// zero if the layer has no opinion. Set for OutOfQuota.
	RetryAfter time.Duration
	// Local is true when the caller's own process rejected the request
	// without sending it (client-side throttling), false when a backend did.
	Local bool
	// Downstream is true when the outcome was decoded from the answer to a
	// call this process made (the adapters' decoders set it), false when this
	// process created it.
	Downstream bool
	// Reason is a short human-readable explanation, e.g. "cpu" or
	// "deadline"; it may be empty.
	Reason string
}

// New returns an overload error of kind k (which must be an overload kind;
// any other kind gives a TaskOverloaded error).
func New(k Kind, reason string) *Error {
	if !k.Overload() {
		k = TaskOverloaded
	}
	return &Error{Kind: k, Reason: reason}
}

// Sentinels for errors.Is. They are never returned themselves; every *Error
// of the matching Kind is Is-equal to them.
var (
	ErrTaskOverloaded = errors.New("task overloaded")
	ErrDontRetry      = errors.New("overloaded; don't retry")
	ErrOutOfQuota     = errors.New("customer out of quota")
)

// Error formats the outcome, e.g. "triage: task overloaded (cpu)".
func (e *Error) Error() string {
	var b [128]byte
	msg := append(append(b[:0], "triage: "...), e.sentinel().Error()...)
	if e.Local {
		msg = append(msg, " (rejected locally)"...)
	}
	if e.Reason != "" {
		msg = append(append(append(msg, " ("...), e.Reason...), ')')
	}
	if e.RetryAfter > 0 {
		msg = append(append(msg, "; retry after "...), e.RetryAfter.String()...)
	}
	return string(msg)
}

func (e *Error) sentinel() error {
	switch e.Kind {
	case DontRetry:
		return ErrDontRetry
	case OutOfQuota:
		return ErrOutOfQuota
	default:
		return ErrTaskOverloaded
	}
}

// Is makes errors.Is(err, ErrTaskOverloaded) (and the others) true for an
// *Error of that kind.
func (e *Error) Is(target error) bool { return target == e.sentinel() }

// Classify returns the Kind of err: Success for nil, the Kind of the first
// *Error in its chain, Failure otherwise.
func Classify(err error) Kind {
	if err == nil {
		return Success
	}
	var oe *Error
	if errors.As(err, &oe) && oe.Kind.Overload() {
		return oe.Kind
	}
	return Failure
}

// Upward returns what a server should answer when its handler fails with
// err. SRE book ch. 21, "Deciding to Retry": "requests should only be retried
// at the layer immediately above the layer that is rejecting them"; once a
// layer gives up on a dependency it returns "overloaded; don't retry". So a
// TaskOverloaded or DontRetry outcome that came from downstream, or from this
// process's own client-side throttling, goes up as DontRetry (keeping its
// RetryAfter); OutOfQuota keeps its kind; an outcome this process created
// for itself, and any other error, is returned unchanged.
func Upward(err error) error {
	if err == nil {
		return nil
	}
	oe, ok := As(err)
	if !ok || !(oe.Downstream || oe.Local) {
		return err
	}
	if oe.Kind == OutOfQuota {
		return &Error{Kind: OutOfQuota, RetryAfter: oe.RetryAfter, Reason: oe.Reason}
	}
	reason := relayedDownstream + oe.Kind.Token()
	if oe.Local {
		reason = relayedLocal
	}
	return &Error{Kind: DontRetry, RetryAfter: oe.RetryAfter, Reason: reason}
}

// The reasons Upward gives the outcomes it relays.
const (
	relayedDownstream = "downstream "
	relayedLocal      = "throttled locally"
)

// Relayed reports whether e is an outcome a server relayed from its own
// dependencies or its own client-side throttling (Upward's "overloaded;
// don't retry" with reason "downstream ..." or "throttled locally"),
// rather than a refusal it made on its own account.
func (e *Error) Relayed() bool {
	return e.Kind == DontRetry && (strings.HasPrefix(e.Reason, relayedDownstream) || e.Reason == relayedLocal)
}

// As returns the first *Error in err's chain.
func As(err error) (*Error, bool) {
	if err == nil {
		return nil, false
	}
	if oe, ok := err.(*Error); ok {
		return oe, true
	}
	var oe *Error
	ok := errors.As(err, &oe)
	return oe, ok
}

// MaxRetryAfter bounds RetryAfter values read from the wire: one day.
const MaxRetryAfter = 24 * time.Hour

// ParseRetryAfterSeconds reads an HTTP Retry-After value in delta-seconds
// (RFC 9110 §10.2.3): 1 to 6 ASCII digits, capped at MaxRetryAfter. The
// HTTP-date form and anything malformed give 0, false.
func ParseRetryAfterSeconds(s string) (time.Duration, bool) {
	if len(s) == 0 || len(s) > 6 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, false
	}
	d := time.Duration(n) * time.Second
	if d > MaxRetryAfter {
		d = MaxRetryAfter
	}
	return d, true
}

// FormatRetryAfterSeconds writes d as whole delta-seconds, rounded up, so a
// caller never retries early.
func FormatRetryAfterSeconds(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	if d > MaxRetryAfter {
		d = MaxRetryAfter
	}
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}
