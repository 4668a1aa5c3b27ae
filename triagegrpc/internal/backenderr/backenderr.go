// Package backenderr says which gRPC errors count against the backend that
// returned them, for the balancer's error counts and the load reports of
// package triagegrpc.
package backenderr

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Failed says whether err counts against the backend: errors a failing or
// overloaded task returns, not the caller's cancellation or an
// application's answer.
func Failed(err error) bool {
	if err == nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Internal, codes.Unknown, codes.DataLoss, codes.ResourceExhausted:
		return true
	}
	return false
}
