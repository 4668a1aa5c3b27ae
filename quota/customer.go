package quota

import (
	"context"

	"github.com/triagehq/triage/internal/reqctx"
)

// CustomerOf returns the customer a request is for, as the server adapter
// established it (a trusted peer's triage-customer, or the peer's mTLS
// identity with WithCustomerFromIdentity), or "" when unknown. Unknown
// customers get the policy's default limit.
func CustomerOf(ctx context.Context) string {
	c, _ := ctx.Value(reqctx.CustomerKey{}).(string)
	return c
}

// NewContext returns a child of ctx for customer (for tests and for code
// that establishes the customer itself).
func NewContext(ctx context.Context, customer string) context.Context {
	return context.WithValue(ctx, reqctx.CustomerKey{}, customer)
}

// Customer returns s if it may name a customer (ValidName), else "": a
// malformed name received on the wire counts as unknown, never as somebody
// else.
func Customer(s string) string {
	if s == "" || validName(s) != nil {
		return ""
	}
	return s
}
