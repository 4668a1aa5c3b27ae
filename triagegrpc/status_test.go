package triagegrpc

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/outcome"
)

// The compact form (code and message, no details) that rejections at the
// transport use decodes to the same outcome as the detailed form.
func TestCompactStatusRoundTrip(t *testing.T) {
	for _, e := range []*outcome.Error{
		{Kind: outcome.TaskOverloaded},
		{Kind: outcome.TaskOverloaded, Reason: "concurrency"},
		{Kind: outcome.DontRetry, Reason: "deadline"},
		{Kind: outcome.OutOfQuota, Reason: "customer a", RetryAfter: 1500 * time.Millisecond},
		{Kind: outcome.OutOfQuota, RetryAfter: 3 * time.Second},
	} {
		for name, st := range map[string]*status.Status{"compact": compactStatus(e), "details": Status(e)} {
			got, ok := FromStatus(st)
			if !ok || got.Kind != e.Kind || got.Reason != e.Reason || got.RetryAfter != e.RetryAfter || !got.Downstream {
				t.Errorf("%s %v: decoded %+v, %v", name, e, got, ok)
			}
		}
		if len(compactStatus(e).Proto().GetDetails()) != 0 {
			t.Errorf("%v: compact status has details", e)
		}
	}
}

// Messages that are not exactly a triage outcome, or whose code does not
// match the outcome, are not outcomes.
func TestCompactStatusRejectsOthers(t *testing.T) {
	for _, tc := range []struct {
		code codes.Code
		msg  string
	}{
		{codes.Unavailable, "connection refused"},
		{codes.Unavailable, "triage: "},
		{codes.Unavailable, "triage: task overloaded!"},
		{codes.Unavailable, "triage: task overloaded (unterminated"},
		{codes.Unavailable, "triage: task overloaded (x) trailing"},
		{codes.Unavailable, "triage: task overloaded; retry after soon"},
		{codes.ResourceExhausted, "triage: task overloaded"},
		{codes.Unavailable, "triage: overloaded; don't retry"},
		{codes.Internal, "triage: customer out of quota"},
		{codes.Unavailable, "triage: task overloaded (" + string(make([]byte, maxReasonLen+1)) + ")"},
		{codes.OK, "triage: task overloaded"},
	} {
		if got, ok := FromStatus(status.New(tc.code, tc.msg)); ok {
			t.Errorf("%v %q decoded as %+v", tc.code, tc.msg, got)
		}
	}
	got, ok := FromStatus(status.New(codes.ResourceExhausted, "triage: customer out of quota; retry after 9999h"))
	if !ok || got.RetryAfter != outcome.MaxRetryAfter {
		t.Errorf("retry after is not clamped: %+v, %v", got, ok)
	}
	got, ok = FromStatus(status.New(codes.ResourceExhausted, "triage: customer out of quota; retry after -3s"))
	if !ok || got.RetryAfter != 0 {
		t.Errorf("negative retry after: %+v, %v", got, ok)
	}
}
