package triagesidecar

import (
	"net/http"
	"strconv"

	"github.com/triagehq/triage/internal/grpcwire"

	"github.com/triagehq/triage/trust"
)

// The gRPC codes the sidecar writes (google.golang.org/grpc/codes).
const (
	codeDeadlineExceeded = 4
	codeUnavailable      = 14
)

// loopbackTrust is Egress's default trust: the service that calls
// through it.
func loopbackTrust() *trust.Policy {
	return trust.MustNew(trust.Config{Networks: []string{"127.0.0.0/8", "::1/128"}})
}

// isGRPC reports whether r is a gRPC call (grpcwire.IsGRPC).
func isGRPC(r *http.Request) bool { return grpcwire.IsGRPC(r.Header.Get("Content-Type")) }

// writeStatus answers a gRPC call with code and msg in a trailers-only
// response: HTTP 200, its status in the headers, no body.
func writeStatus(w http.ResponseWriter, code int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "application/grpc")
	h.Set("Grpc-Status", strconv.Itoa(code))
	h.Set("Grpc-Message", grpcwire.EncodeMessage(msg))
	w.WriteHeader(http.StatusOK)
}
