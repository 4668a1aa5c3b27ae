// Package triagegrpc adapts triage to gRPC-Go: server and client
// interceptors that carry criticality and the attempt counter across every
// RPC hop, and the mapping between triage's overload outcomes and gRPC
// statuses.
//
// SRE book ch. 21, "Criticality": "If a backend receives request A and, as
// part of executing that request, issues outgoing request B and request C to
// other backends, request B and request C will use the same criticality as
// request A by default." A Server's interceptors read criticality and attempt
// from the incoming metadata (believed only from trusted peers, see package
// trust) and put them in the handler's context; a Client's interceptors
// write what package egress says each outgoing call carries (the context's
// criticality, the attempt counter the retry layer set, the decay and the
// customer) into the calls to the hosts its egress.Caller names internal.
// Code overrides the criticality for a call with criticality.NewContext.
//
// # Overload outcomes on the wire
//
// Every outcome is a gRPC status with a google.rpc.ErrorInfo detail
// (domain ErrorDomain, reason TASK_OVERLOADED, OVERLOADED_DONT_RETRY or
// OUT_OF_QUOTA) and, when the server has a retry-after, a google.rpc.RetryInfo
// detail. Those are standard messages, so any gRPC client decodes them (in Go
// with google.golang.org/genproto/googleapis/rpc/errdetails). The codes are
// chosen so that clients without triage also do the right thing. Admission
// rejections at the tap handle, the bulk of a task's answers under heavy
// overload, are sent in compact form, code and message only, because
// grpc-go marshals details anew for every rejected stream; FromStatus reads
// both forms. The codes are:
//
//	task overloaded          UNAVAILABLE         (retriable, on another task)
//	overloaded; don't retry  RESOURCE_EXHAUSTED  (not retried by default)
//	customer out of quota    RESOURCE_EXHAUSTED  (+ RetryInfo)
//
// "Requests should only be retried at the layer immediately above the layer
// that is rejecting them" (ch. 21, "Deciding to Retry"): when a handler
// returns an overload outcome it received from a downstream call, the Server
// interceptor sends it up as "overloaded; don't retry", so the layers above
// do not retry again.
package triagegrpc
