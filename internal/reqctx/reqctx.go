// Package reqctx holds the context keys of criticality, the incoming
// attempt counter and the customer, and a context node that carries all
// three, so a server adapter attaches what it decoded from a request with a
// single allocation. It imports only the standard library; packages
// criticality, attempt and quota read through it.
package reqctx

import "context"

// CriticalityKey is the context key of a request's criticality; its value
// is a uint8 (criticality.Level).
type CriticalityKey struct{}

// IncomingAttemptKey is the context key of the attempt counter a server
// received; its value is a uint8.
type IncomingAttemptKey struct{}

// CustomerKey is the context key of the customer a request is for; its
// value is a string ("" when unknown).
type CustomerKey struct{}

// CostKey is the context key of the request's cost measurement; its value
// is a *cost.Tracker.
type CostKey struct{}

type node struct {
	context.Context
	level    uint8
	attempt  uint8
	customer string
}

// WithRequest returns a child of parent that carries the three values, in
// one allocation. Cancellation and deadlines are the parent's.
func WithRequest(parent context.Context, level, attempt uint8, customer string) context.Context {
	return &node{Context: parent, level: level, attempt: attempt, customer: customer}
}

// Value answers the two keys and delegates everything else to the parent.
func (n *node) Value(key any) any {
	switch key.(type) {
	case CriticalityKey:
		return n.level
	case IncomingAttemptKey:
		return n.attempt
	case CustomerKey:
		return n.customer
	}
	return n.Context.Value(key)
}

func (n *node) String() string { return "triage request context" }
