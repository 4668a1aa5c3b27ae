// Package reqctx holds the context keys of criticality, the incoming
// attempt counter, the customer and the cost tracker. intake.Handle
// answers them all from one context node, so a server attaches what it
// decided about a request with a single allocation; packages
// criticality, attempt, quota and cost read through these keys. It
// imports only the standard library.
package reqctx

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
