package lb

import (
	"testing"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagegrpc"
)

// After an outage every backend has a backlog, and its first answers are
// refusals of it. A backend on probation (ejected for not answering, its
// ejection over) whose probe comes back refused on its own account
// ("task overloaded", in either wire form, its own "don't retry", or the
// caller out of quota) answers: it takes its share again. A failure
// relayed from its dependencies, or an error that is no triage refusal,
// keeps it out (the backend whose dependencies are gone fails fast).
func TestOwnRefusalEndsTheProbation(t *testing.T) {
	own := func(err error) error { return triagegrpc.ToError(err) }
	for _, c := range []struct {
		name   string
		err    error
		proven bool
	}{
		{"task overloaded", own(outcome.New(outcome.TaskOverloaded, "deadline")), true},
		{"task overloaded, compact", status.Error(codes.Unavailable, outcome.New(outcome.TaskOverloaded, "concurrency").Error()), true},
		{"its own don't retry", own(outcome.New(outcome.DontRetry, "concurrency")), true},
		{"out of quota", own(&outcome.Error{Kind: outcome.OutOfQuota, RetryAfter: time.Second}), true},
		{"relayed from downstream", own(outcome.Upward(&outcome.Error{Kind: outcome.TaskOverloaded, Downstream: true})), false},
		{"relayed from its throttle", own(outcome.Upward(&outcome.Error{Kind: outcome.DontRetry, Local: true})), false},
		{"unavailable", status.Error(codes.Unavailable, "connection refused"), false},
		{"internal", status.Error(codes.Internal, "boom"), false},
	} {
		clk := clock.NewFake(time.Unix(0, 0))
		b, eps := healthyBalancer(t, balance.WithClock(clk))
		probed := eps[0]
		for range balance.DefaultEjectAfter { // unanswered at their deadlines: ejected
			for e, _ := b.Pick(); ; e, _ = b.Pick() {
				if e == probed {
					finish(e, balancer.DoneInfo{Err: status.Error(codes.DeadlineExceeded, "")}, true, nil)
					break
				}
				finish(e, balancer.DoneInfo{BytesReceived: true}, false, nil)
			}
		}
		if probed.State() != balance.Unresponsive {
			t.Fatalf("%s: after %d unanswered calls the backend is %v", c.name, balance.DefaultEjectAfter, probed.State())
		}
		clk.Advance(balance.DefaultEjection + time.Millisecond)
		share := 0
		for i := range 200 {
			e, err := b.Pick()
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			di := balancer.DoneInfo{BytesReceived: true}
			if e == probed {
				share++
				if share == 1 {
					di.Err = c.err // the probe
				}
			}
			finish(e, di, false, nil)
			if i == 100 {
				clk.Advance(10 * time.Millisecond)
			}
		}
		if proven := share > 50; proven != c.proven {
			t.Errorf("%s: the backend took %d of the 200 calls after its probe was answered so (state %v); want a share: %v", c.name, share, probed.State(), c.proven)
		}
	}
}

// healthyBalancer returns a Balancer with two healthy endpoints, "a" and
// "b".
func healthyBalancer(t testing.TB, opts ...balance.Option) (*balance.Balancer, []*balance.Endpoint) {
	t.Helper()
	b, err := balance.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	eps, err := b.SetEndpoints([]string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range eps {
		e.SetState(balance.Healthy)
	}
	return b, eps
}
