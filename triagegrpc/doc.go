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
//
// # What it changes on your server and clients
//
// What a user would not guess from the names:
//
//   - Server.ServerOptions takes gRPC's one InTapHandle: admission decides
//     at stream arrival, before a goroutine exists. A server that needs its
//     own tap calls Server.TapHandle from it.
//   - It sets grpc.MaxConcurrentStreams(DefaultMaxConcurrentStreams, 1000)
//     per connection, so that one connection cannot hold the whole task;
//     a MaxConcurrentStreams passed after it wins.
//   - Its interceptors and stats handler run before yours.
//   - triage-* metadata from a peer that is not trusted is removed before
//     your handler sees it; the request's criticality is then the rules'
//     or the default, CRITICAL.
//   - A stream whose message comes more than 500 ms after its headers is
//     refused (admission.WithMessageTimeout), and its connection is
//     penalised: refused at arrival from 1 s, doubling to a minute.
//   - Client.DialOptions turns off the service config's retryPolicy and
//     hedgingPolicy on the connection (WithServiceConfigRetries keeps
//     them): only one layer retries.
//   - Probes: the health service "" is NOT_SERVING in warm-up and lame duck
//     (NewLifecycle), the right answer for readiness; liveness asks for
//     LivenessService (HealthServer).
//   - The zero criticality.Level is SHEDDABLE, the lowest.
package triagegrpc
