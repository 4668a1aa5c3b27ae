// Package criticality implements the book's four request criticalities and
// carries them in a context.Context.
//
// SRE book ch. 21, "Criticality": every request is CRITICAL_PLUS, CRITICAL,
// SHEDDABLE_PLUS or SHEDDABLE. CRITICAL is the default for requests from
// production jobs; services provision for all their CRITICAL and
// CRITICAL_PLUS traffic. Criticality is first-class in the RPC system and is
// propagated automatically: an outgoing request made while serving request A
// has A's criticality unless the code overrides it. The adapters
// (triagegrpc, triagehttp) do that propagation; this package only defines
// the levels and the context plumbing, and imports nothing but the standard
// library.
package criticality

import (
	"context"
	"errors"
	"fmt"

	"github.com/triagehq/triage/internal/reqctx"
)

// Level is a request's criticality. Higher levels are more critical and are
// shed later: CriticalPlus > Critical > SheddablePlus > Sheddable, so levels
// compare with < and >.
//
// The zero value is Sheddable; use Default (Critical) when nothing is known.
type Level uint8

// The four levels, in increasing order of criticality.
const (
	// Sheddable is traffic for which frequent partial unavailability and
	// occasional full unavailability is expected.
	Sheddable Level = iota
	// SheddablePlus is traffic for which partial unavailability is
	// expected: the default for batch jobs, which can retry minutes or
	// even hours later.
	SheddablePlus
	// Critical is the default for requests from production jobs: failures
	// have user-visible impact.
	Critical
	// CriticalPlus is reserved for the most critical requests, those whose
	// failure has serious user-visible impact.
	CriticalPlus
)

// Default is the level of a request that carries none: CRITICAL, the book's
// default for requests sent from production jobs.
const Default = Critical

// NumLevels is the number of levels; Level values are 0..NumLevels-1, so a
// Level indexes a [NumLevels]T array.
const NumLevels = 4

// MaxNameLen is the length of the longest canonical name ("SHEDDABLE_PLUS");
// Parse rejects longer input without looking at it.
const MaxNameLen = len("SHEDDABLE_PLUS")

var names = [NumLevels]string{"SHEDDABLE", "SHEDDABLE_PLUS", "CRITICAL", "CRITICAL_PLUS"}

// All returns the levels from most to least critical.
func All() [NumLevels]Level {
	return [NumLevels]Level{CriticalPlus, Critical, SheddablePlus, Sheddable}
}

// String returns the canonical name (e.g. "CRITICAL_PLUS"), or
// "Level(N)" for a value out of range.
func (l Level) String() string {
	if l.Valid() {
		return names[l]
	}
	return fmt.Sprintf("Level(%d)", uint8(l))
}

// Valid reports whether l is one of the four levels.
func (l Level) Valid() bool { return l < NumLevels }

// ErrInvalid is returned, wrapped, by Parse for anything that is not a
// canonical name.
var ErrInvalid = errors.New("criticality: invalid level")

// Parse returns the level named s. Only the four canonical names are
// accepted, exactly as String writes them (upper case, underscore); anything
// else, including empty, padded, lower-case or over-long input, yields
// Default and an error wrapping ErrInvalid. Parse does not allocate on
// success.
func Parse(s string) (Level, error) {
	if len(s) <= MaxNameLen {
		for i, n := range names {
			if s == n {
				return Level(i), nil
			}
		}
	}
	return Default, invalidError{s}
}

type invalidError struct{ s string }

func (e invalidError) Error() string {
	s := e.s
	if len(s) > 32 {
		s = s[:32] + "..."
	}
	return fmt.Sprintf("criticality: invalid level %q (want one of CRITICAL_PLUS, CRITICAL, SHEDDABLE_PLUS, SHEDDABLE)", s)
}

func (invalidError) Unwrap() error { return ErrInvalid }

// MarshalText implements encoding.TextMarshaler with the canonical name.
func (l Level) MarshalText() ([]byte, error) {
	if !l.Valid() {
		return nil, fmt.Errorf("criticality: cannot marshal %v", l)
	}
	return []byte(names[l]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with Parse.
func (l *Level) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// NewContext returns a copy of ctx carrying level l. Outgoing requests made
// with the returned context inherit l (this is how code overrides the
// criticality it was called with). If ctx already carries l, ctx itself is
// returned and nothing is allocated.
func NewContext(ctx context.Context, l Level) context.Context {
	if cur, ok := FromContext(ctx); ok && cur == l {
		return ctx
	}
	return context.WithValue(ctx, reqctx.CriticalityKey{}, uint8(l))
}

// FromContext returns the level ctx carries and whether it carries one.
// It does not allocate.
func FromContext(ctx context.Context) (Level, bool) {
	l, ok := ctx.Value(reqctx.CriticalityKey{}).(uint8)
	return Level(l), ok
}

// Of returns the level ctx carries, or Default.
func Of(ctx context.Context) Level {
	if l, ok := FromContext(ctx); ok {
		return l
	}
	return Default
}
