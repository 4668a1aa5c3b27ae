// Package wire is the registry of every metadata key and HTTP header that
// triage sends or reads, with the size bound each one's value must respect.
//
// The SRE book (ch. 21, "Criticality") makes criticality part of the RPC
// system, and "Deciding to Retry" adds an attempt counter to request
// metadata. Values a caller sends are believed only from peers the operator
// trusts (package trust); for every other peer the edge strips every key in
// this registry, so a key added later cannot be forgotten. Every key starts
// with Prefix, and the adapters strip anything with that prefix, registered
// or not.
//
// Keys are lower case, as gRPC metadata requires; HTTP header matching is
// case-insensitive, so the same names serve as header names.
package wire

import (
	"net/textproto"
	"strings"
)

// Prefix starts every triage key. Adapters strip every inbound key with this
// prefix from untrusted peers, whether or not it is registered.
const Prefix = "triage-"

// Direction says whether a key travels on requests or on responses.
type Direction uint8

const (
	// Request keys travel from caller to callee.
	Request Direction = iota + 1
	// Response keys travel from callee to caller.
	Response
)

// Key describes one registered key.
type Key struct {
	// Name is the lower-case metadata key, also used as the HTTP header.
	Name string
	// Direction is which way it travels.
	Direction Direction
	// MaxLen is the largest value, in bytes, a parser accepts.
	MaxLen int
	// Doc says what the value means.
	Doc string
}

// The registered keys.
const (
	// CriticalityKey carries the request's criticality as a canonical name
	// (criticality.Level.String).
	CriticalityKey = "triage-criticality"
	// AttemptKey carries the attempt counter: 0 on the first try, +1 per
	// retry, as 1 or 2 decimal digits. Advisory only.
	AttemptKey = "triage-attempt"
	// OutcomeKey names an overload outcome on an HTTP response
	// (outcome.Kind.Token).
	OutcomeKey = "triage-outcome"
	// LameDuckKey, "1" on a response (a gRPC trailer, an HTTP header),
	// says the backend is in lame duck state: SRE book ch. 20, "it
	// broadcasts that fact to all its active clients".
	LameDuckKey = "triage-lame-duck"
	// CustomerKey carries the customer a request is for (quota
	// accounting), believed only from trusted peers: a frontend that
	// authenticated the caller.
	CustomerKey = "triage-customer"
	// DecayKey carries how the request's criticality decays
	// (criticality.FormatDecay): the milliseconds left and the level it
	// then falls to, "1850:SHEDDABLE".
	DecayKey = "triage-criticality-decay"
	// QuotaLeaderKey, on a quota service replica's refusal (a gRPC
	// trailer), names the replica the caller should ask instead: the
	// leader's advertised address, when the refusing replica knows it.
	QuotaLeaderKey = "triage-quota-leader"
	// ReportSpanMetric is the named metric of an ORCA load report
	// (per call or out of band) that says over how many seconds the
	// backend measured the report's rates: a client weighs a report
	// measured over its blackout period at once (balance.Load.Span).
	ReportSpanMetric = "triage.report_span_s"
	// CustomerMaxLen bounds a customer name on the wire; longer values
	// are ignored (the customer is unknown).
	CustomerMaxLen = 64
)

// The keys in net/http's canonical spelling (textproto's), for header maps
// that hold it, so that lookups do not canonicalize on every request.
// TestCanonicalSpellings checks each against its key.
const (
	CriticalityHeader         = "Triage-Criticality"
	DecayHeader               = "Triage-Criticality-Decay"
	AttemptHeader             = "Triage-Attempt"
	CustomerHeader            = "Triage-Customer"
	OutcomeHeader             = "Triage-Outcome"
	LameDuckHeader            = "Triage-Lame-Duck"
	ForwardedClientCertHeader = "X-Forwarded-Client-Cert"
)

// Header returns a key's spelling in net/http's header maps
// (CriticalityHeader for CriticalityKey, and so on), without allocating
// for the keys that have a constant here; any other name is canonicalized
// by net/textproto.
func Header(name string) string {
	switch name {
	case CriticalityKey:
		return CriticalityHeader
	case DecayKey:
		return DecayHeader
	case AttemptKey:
		return AttemptHeader
	case CustomerKey:
		return CustomerHeader
	case OutcomeKey:
		return OutcomeHeader
	case LameDuckKey:
		return LameDuckHeader
	case ForwardedClientCertKey:
		return ForwardedClientCertHeader
	case LoadReportKey:
		return LoadReportBinHeader
	}
	return textproto.CanonicalMIMEHeaderKey(name)
}

// Not triage's own, read only from a trusted proxy (trust.Forwarders), and
// never stripped: the service may read it too.
const (
	// ForwardedClientCertKey is Envoy's x-forwarded-client-cert: the
	// client certificate a proxy that terminated mTLS saw.
	ForwardedClientCertKey = "x-forwarded-client-cert"
	// ForwardedClientCertMaxLen bounds the header triage reads (a URL-encoded
	// certificate with its chain fits); a longer one names no caller.
	ForwardedClientCertMaxLen = 16 << 10
)

// ORCA's load report (xds.data.orca.v3.OrcaLoadReport), which a backend
// sends with its responses and triage reads, never writes on a caller's
// behalf: in a gRPC trailer, and in an HTTP response's header.
const (
	// LoadReportKey is the report serialized (gRPC's binary metadata;
	// base64 in an HTTP header or trailer): what grpc-go's
	// weighted_round_robin and triage's balancer read.
	LoadReportKey = "endpoint-load-metrics-bin"
	// LoadReportBinHeader is LoadReportKey in net/http's spelling.
	LoadReportBinHeader = "Endpoint-Load-Metrics-Bin"
	// LoadReportHeader is the report as an HTTP header's text, as Envoy
	// reads it from an upstream: "TEXT name=value, ...", "JSON {...}"
	// or "BIN " and the base64 binary report.
	LoadReportHeader = "Endpoint-Load-Metrics"
)

// ClaimPrefix names a caller's request key as Envoy's filters copy it
// ahead of triage's processor (docs/envoy.md): x-triage-claimed-criticality
// is the caller's triage-criticality under a name no service reads, so that
// Envoy, failing open while the processor is down, forwards no caller's
// claim as a key. The processor reads a claim as the key it names, trusted
// as the key would be, and removes it.
const ClaimPrefix = "x-triage-claimed-"

// Claimed returns the key a claim header names (ClaimPrefix, any case):
// "x-triage-claimed-criticality" names "triage-criticality".
func Claimed(name string) (key string, ok bool) {
	if len(name) <= len(ClaimPrefix) || !strings.EqualFold(name[:len(ClaimPrefix)], ClaimPrefix) {
		return "", false
	}
	return Prefix + strings.ToLower(name[len(ClaimPrefix):]), true
}

var registry = [...]Key{
	{CriticalityKey, Request, 14, "criticality of the request: CRITICAL_PLUS, CRITICAL, SHEDDABLE_PLUS or SHEDDABLE"},
	{DecayKey, Request, 22, "milliseconds until the criticality decays, and the level it falls to: 1850:SHEDDABLE"},
	{AttemptKey, Request, 2, "attempt counter, 0 on the first try; advisory, feeds histograms only"},
	{OutcomeKey, Response, 32, "overload outcome of an HTTP response: task-overloaded, overloaded-dont-retry, out-of-quota"},
	{CustomerKey, Request, CustomerMaxLen, "customer the request is for (quotas); believed only from trusted peers"},
	{LameDuckKey, Response, 1, "1 while the backend is in lame duck state: send new requests elsewhere"},
	{QuotaLeaderKey, Response, 64, "on a quota service follower's refusal: the leader's address, host:port"},
}

// Keys returns every registered key. The result is a copy.
func Keys() []Key {
	out := make([]Key, len(registry))
	copy(out, registry[:])
	return out
}

// Lookup returns the registered key named name (case-insensitively).
func Lookup(name string) (Key, bool) {
	for _, k := range registry {
		if strings.EqualFold(k.Name, name) {
			return k, true
		}
	}
	return Key{}, false
}

// IsTriage reports whether name (a metadata key or header name, any case)
// belongs to triage: it starts with Prefix, or with Prefix spelled with an
// underscore ("triage_"), which servers and gateways that fold '_' into
// '-' (CGI and WSGI-style environments, some proxies) would read as
// triage's. It does not allocate.
func IsTriage(name string) bool {
	n := len(Prefix) - 1
	return len(name) > n && strings.EqualFold(name[:n], Prefix[:n]) && (name[n] == '-' || name[n] == '_')
}

// Folded reports whether name is a triage key spelled with an underscore
// anywhere: never triage's own spelling, so the edge drops it whoever
// sends it, as Envoy's headers_with_underscores_action does.
func Folded(name string) bool { return IsTriage(name) && strings.IndexByte(name, '_') >= 0 }
