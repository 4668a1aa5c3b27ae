// Package reqctx holds the context keys of criticality and the incoming
// attempt counter, and a context node that carries both, so a server adapter
// attaches what it decoded from a request with a single allocation. It
// imports only the standard library; packages criticality and attempt read
// through it.
package reqctx

import "context"

// CriticalityKey is the context key of a request's criticality; its value
// is a uint8 (criticality.Level).
type CriticalityKey struct{}

// IncomingAttemptKey is the context key of the attempt counter a server
// received; its value is a uint8.
type IncomingAttemptKey struct{}

type node struct {
	context.Context
	level   uint8
	attempt uint8
}

// WithRequest returns a child of parent that carries both values, in one
// allocation. Cancellation and deadlines are the parent's.
func WithRequest(parent context.Context, level, attempt uint8) context.Context {
	return &node{Context: parent, level: level, attempt: attempt}
}

// Value answers the two keys and delegates everything else to the parent.
func (n *node) Value(key any) any {
	switch key.(type) {
	case CriticalityKey:
		return n.level
	case IncomingAttemptKey:
		return n.attempt
	}
	return n.Context.Value(key)
}

func (n *node) String() string { return "triage request context" }
