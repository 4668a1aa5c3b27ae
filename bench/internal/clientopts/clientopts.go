// Package clientopts builds the triage client side the benchmark commands
// dial their own loopback backends with.
package clientopts

import (
	"google.golang.org/grpc"

	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/triagegrpc"
)

// Dial returns the DialOptions of a triagegrpc.Client whose Caller is
// made with opts and sends triage's keys to every host (the benchmarks
// dial only their own backends), or an error.
func Dial(opts []egress.Option, copts ...triagegrpc.ClientOption) ([]grpc.DialOption, error) {
	caller, err := egress.New(append([]egress.Option{egress.WithInternal("*")}, opts...)...)
	if err != nil {
		return nil, err
	}
	c, err := triagegrpc.NewClient(caller, copts...)
	if err != nil {
		return nil, err
	}
	return c.DialOptions(), nil
}

// MustDial is Dial for options known to be valid: it panics on an error.
func MustDial(opts []egress.Option, copts ...triagegrpc.ClientOption) []grpc.DialOption {
	d, err := Dial(opts, copts...)
	if err != nil {
		panic(err)
	}
	return d
}
