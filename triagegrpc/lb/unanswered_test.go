package lb

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A call counts as unanswered when it waited nine tenths of its deadline
// or more and got nothing of use: no bytes at all, or the backend's own
// DEADLINE_EXCEEDED at the deadline (a backend whose dependencies hang
// answers so, and such an answer must not end its ejection's probation).
func TestUnansweredCall(t *testing.T) {
	deadline := time.Now().Add(50 * time.Millisecond)
	late := deadline.Add(-time.Second)         // picked a second before the deadline: 95% waited now
	early := time.Now().Add(-time.Millisecond) // picked just now
	dl := status.Error(codes.DeadlineExceeded, "deadline exceeded")
	for _, c := range []struct {
		name   string
		di     balancer.DoneInfo
		picked time.Time
		want   bool
	}{
		{"nothing received at the deadline", balancer.DoneInfo{Err: dl}, late, true},
		{"cancelled at the deadline, nothing received", balancer.DoneInfo{Err: status.Error(codes.Canceled, "")}, late, true},
		{"the backend's DEADLINE_EXCEEDED at the deadline", balancer.DoneInfo{Err: dl, BytesReceived: true}, late, true},
		{"the backend's DEADLINE_EXCEEDED early", balancer.DoneInfo{Err: dl, BytesReceived: true}, early, false},
		{"cancelled at the deadline after an answer began", balancer.DoneInfo{Err: status.Error(codes.Canceled, ""), BytesReceived: true}, late, false},
		{"an error answer at the deadline", balancer.DoneInfo{Err: status.Error(codes.Unavailable, ""), BytesReceived: true}, late, false},
		{"a success", balancer.DoneInfo{BytesReceived: true}, late, false},
		{"another error", balancer.DoneInfo{Err: errors.New("x")}, late, false},
	} {
		if got := unanswered(c.di, c.picked, deadline); got != c.want {
			t.Errorf("%s: unanswered %v, want %v", c.name, got, c.want)
		}
	}
}
