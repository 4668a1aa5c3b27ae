package triagegrpc

import (
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/triagehq/triage/internal/grpcwire"
	"github.com/triagehq/triage/outcome"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of triage's outcomes.
const ErrorDomain = "triage"

// ErrorInfo reasons, one per overload outcome.
const (
	ReasonTaskOverloaded = "TASK_OVERLOADED"
	ReasonDontRetry      = "OVERLOADED_DONT_RETRY"
	ReasonOutOfQuota     = "OUT_OF_QUOTA"
)

// maxDetails bounds how many status details FromStatus looks at.
const maxDetails = 16

// maxReasonLen bounds the free-text reason carried in ErrorInfo metadata.
const maxReasonLen = 128

var (
	errorInfoURL = "type.googleapis.com/" + string((&errdetails.ErrorInfo{}).ProtoReflect().Descriptor().FullName())
	retryInfoURL = "type.googleapis.com/" + string((&errdetails.RetryInfo{}).ProtoReflect().Descriptor().FullName())
)

// Code returns the gRPC code of an overload kind (see the package doc);
// codes.Unknown for any other kind.
func Code(k outcome.Kind) codes.Code {
	switch k {
	case outcome.TaskOverloaded:
		return codes.Unavailable
	case outcome.DontRetry, outcome.OutOfQuota:
		return codes.ResourceExhausted
	}
	return codes.Unknown
}

func reasonOf(k outcome.Kind) string {
	switch k {
	case outcome.DontRetry:
		return ReasonDontRetry
	case outcome.OutOfQuota:
		return ReasonOutOfQuota
	}
	return ReasonTaskOverloaded
}

func kindOf(reason string) (outcome.Kind, bool) {
	switch reason {
	case ReasonTaskOverloaded:
		return outcome.TaskOverloaded, true
	case ReasonDontRetry:
		return outcome.DontRetry, true
	case ReasonOutOfQuota:
		return outcome.OutOfQuota, true
	}
	return outcome.Failure, false
}

// Status returns the gRPC status of an overload outcome, with its ErrorInfo
// and (if RetryAfter > 0) RetryInfo details.
func Status(e *outcome.Error) *status.Status {
	st := status.New(Code(e.Kind), e.Error())
	info := &errdetails.ErrorInfo{Reason: reasonOf(e.Kind), Domain: ErrorDomain}
	if e.Reason != "" {
		r := e.Reason
		if len(r) > maxReasonLen {
			r = r[:maxReasonLen]
		}
		info.Metadata = map[string]string{"reason": r}
	}
	details := []proto.Message{info}
	if e.RetryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(e.RetryAfter)})
	}
	p := st.Proto()
	for _, d := range details {
		any, err := anyOf(d)
		if err != nil {
			continue
		}
		p.Details = append(p.Details, any)
	}
	return status.FromProto(p)
}

// compactStatus is an outcome's status in compact form: its code and
// e.Error() as the message, without details. Rejections at the transport
// use it because grpc-go marshals a status's details for every rejected
// stream, and the client unmarshals them (docs/rationale.md, "Compact
// rejections"), and at 10x overload rejections are most of a
// task's work. FromStatus reads both forms.
func compactStatus(e *outcome.Error) *status.Status {
	return status.New(Code(e.Kind), e.Error())
}

// fromMessage decodes the compact form: a status without details whose
// message is exactly what outcome.Error.Error() writes for a remote
// outcome ("triage: task overloaded (reason); retry after 1s"), with the
// code Code gives that kind. Anything else returns false.
func fromMessage(c codes.Code, msg string) (*outcome.Error, bool) {
	rest, ok := strings.CutPrefix(msg, "triage: ")
	if !ok {
		return nil, false
	}
	var e outcome.Error
	for _, k := range [...]outcome.Kind{outcome.TaskOverloaded, outcome.DontRetry, outcome.OutOfQuota} {
		if r, ok := strings.CutPrefix(rest, sentinelText(k)); ok && Code(k) == c {
			e.Kind, rest = k, r
			break
		}
	}
	if !e.Kind.Overload() {
		return nil, false
	}
	if r, ok := strings.CutPrefix(rest, " ("); ok {
		i := strings.IndexByte(r, ')')
		if i < 0 || i > maxReasonLen {
			return nil, false
		}
		e.Reason, rest = r[:i], r[i+1:]
	}
	if d, ok := strings.CutPrefix(rest, "; retry after "); ok {
		dur, err := time.ParseDuration(d)
		if err != nil {
			return nil, false
		}
		e.RetryAfter = min(max(dur, 0), outcome.MaxRetryAfter)
		rest = ""
	}
	if rest != "" {
		return nil, false
	}
	e.Downstream = true
	return &e, true
}

func sentinelText(k outcome.Kind) string {
	switch k {
	case outcome.DontRetry:
		return outcome.ErrDontRetry.Error()
	case outcome.OutOfQuota:
		return outcome.ErrOutOfQuota.Error()
	}
	return outcome.ErrTaskOverloaded.Error()
}

// ToError converts err for the wire: an overload outcome becomes its gRPC
// status error; anything else is returned unchanged.
func ToError(err error) error {
	if err == nil {
		return nil
	}
	if oe, ok := outcome.As(err); ok && oe.Kind.Overload() {
		return Status(oe).Err()
	}
	return err
}

// FromStatus decodes an overload outcome from a status received over the
// wire; the result has Downstream set. It looks at most at the first 16
// details; it accepts only an ErrorInfo of ErrorDomain with one of the
// three reasons, and a RetryInfo delay clamped to [0, outcome.MaxRetryAfter].
// A status without details is read in the compact form rejections at the
// transport use: the outcome's code and exact message. Anything else
// (foreign domain, other messages, malformed bytes) returns false.
func FromStatus(st *status.Status) (*outcome.Error, bool) {
	if st == nil || st.Code() == codes.OK {
		return nil, false
	}
	p := st.Proto()
	var (
		kind  outcome.Kind
		found bool
		e     outcome.Error
	)
	for i, d := range p.GetDetails() {
		if i >= maxDetails {
			break
		}
		switch d.GetTypeUrl() {
		case errorInfoURL:
			var info errdetails.ErrorInfo
			if proto.Unmarshal(d.GetValue(), &info) != nil || info.GetDomain() != ErrorDomain {
				continue
			}
			k, ok := kindOf(info.GetReason())
			if !ok {
				continue
			}
			kind, found = k, true
			if r := info.GetMetadata()["reason"]; len(r) <= maxReasonLen {
				e.Reason = r
			}
		case retryInfoURL:
			var ri errdetails.RetryInfo
			if proto.Unmarshal(d.GetValue(), &ri) != nil || ri.GetRetryDelay() == nil {
				continue
			}
			// CheckValid rejects out-of-range seconds and mixed signs.
			if ri.GetRetryDelay().CheckValid() != nil {
				continue
			}
			dur := ri.GetRetryDelay().AsDuration()
			if dur < 0 {
				dur = 0
			}
			if dur > outcome.MaxRetryAfter {
				dur = outcome.MaxRetryAfter
			}
			e.RetryAfter = dur
		}
	}
	if !found {
		if len(p.GetDetails()) == 0 {
			return fromMessage(st.Code(), st.Message())
		}
		return nil, false
	}
	e.Kind = kind
	e.Downstream = true
	return &e, true
}

// RemoteError is an overload outcome as the Client interceptors return it:
// received from a downstream call, or created by the Client's Policy (a
// local rejection, or "overloaded; don't retry" after giving up). It unwraps to the *outcome.Error, so
// errors.Is(err, outcome.ErrTaskOverloaded) and outcome.Classify work, and it
// keeps the status, so status.Code(err) and status.FromError work too.
type RemoteError struct {
	// Outcome is the decoded outcome.
	Outcome *outcome.Error
	st      *status.Status
}

// GRPCStatus returns the status as received.
func (e *RemoteError) GRPCStatus() *status.Status { return e.st }

// Unwrap returns the decoded outcome.
func (e *RemoteError) Unwrap() error { return e.Outcome }

// Error returns the status message.
func (e *RemoteError) Error() string { return e.st.Err().Error() }

// fromWire turns an error returned by a gRPC call into a *RemoteError when it
// carries an overload outcome.
func fromWire(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	if oe, ok := FromStatus(st); ok {
		return &RemoteError{Outcome: oe, st: st}
	}
	return err
}

func anyOf(m proto.Message) (*anypb.Any, error) { return anypb.New(m) }

// Pushback trailers, built once.
var (
	pushbackNever = metadata.Pairs(grpcwire.RetryPushbackKey, grpcwire.FormatPushback(false, 0))
)

// pushback returns the grpc-retry-pushback-ms trailer of a refusal or an
// outcome a handler answers, which stock gRPC clients with a retry policy
// honour: "-1" for every outcome but task overloaded (the book's retry is
// one layer above the refusal only, and never for out of quota), the
// RetryAfter in milliseconds for task overloaded with one, and none
// otherwise (the client's backoff and retry throttling decide). nil for
// anything that is not an overload outcome.
func pushback(err error) metadata.MD {
	oe, ok := outcome.As(err)
	if !ok || !oe.Kind.Overload() {
		return nil
	}
	if !oe.Kind.Retriable() {
		return pushbackNever
	}
	if v := grpcwire.FormatPushback(true, oe.RetryAfter); v != "" {
		return metadata.Pairs(grpcwire.RetryPushbackKey, v)
	}
	return nil
}
