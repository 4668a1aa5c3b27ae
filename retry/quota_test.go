package retry_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/retry"
)

// A frontend serves two customers at the same criticality; the backend
// answers one of them "out of quota". That customer's requests are soon
// throttled locally; the other's never are, and neither is a request
// without a customer.
func TestOutOfQuotaThrottlesOnlyThatCustomer(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	draws := 0.0
	p, err := retry.New(retry.WithClock(f), retry.WithRandom(func() float64 { draws += 0.37; return draws - float64(int(draws)) }))
	if err != nil {
		t.Fatal(err)
	}
	ctxOf := func(customer string) context.Context {
		return quota.NewContext(criticality.NewContext(context.Background(), criticality.Critical), customer)
	}
	refusedAtBackend := map[string]int{}
	throttled := map[string]int{}
	for range 2000 {
		for _, c := range []string{"abuser", "gmail", ""} {
			err := p.Do(ctxOf(c), func(context.Context) error {
				if c == "abuser" {
					refusedAtBackend[c]++
					return &outcome.Error{Kind: outcome.OutOfQuota}
				}
				return nil
			})
			if oe, ok := outcome.As(err); ok && oe.Local {
				throttled[c]++
			}
		}
		f.Advance(10 * time.Millisecond)
	}
	t.Logf("reached the backend: abuser %d of 2000; throttled locally: %v", refusedAtBackend["abuser"], throttled)
	if throttled["gmail"] != 0 || throttled[""] != 0 {
		t.Errorf("in-quota requests throttled: %v", throttled)
	}
	if throttled["abuser"] < 1000 {
		t.Errorf("the out-of-quota customer was throttled only %d times of 2000", throttled["abuser"])
	}
}

// Per-customer throttles at their bound (issue 21, item 7): after 256
// customers have come and gone, a new customer that runs out of quota
// still gets a throttle of its own once the old ones have been idle for a
// window, instead of sharing the overflow throttle with every customer
// seen since, so one abuser among the overflow does not throttle the
// others.
func TestQuotaThrottlesEvictIdleCustomers(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	draws := 0.0
	p, err := retry.New(retry.WithClock(f), retry.WithRandom(func() float64 { draws += 0.37; return draws - float64(int(draws)) }))
	if err != nil {
		t.Fatal(err)
	}
	ctxOf := func(customer string) context.Context {
		return quota.NewContext(criticality.NewContext(context.Background(), criticality.Critical), customer)
	}
	for i := range retry.MaxQuotaThrottles + 10 {
		p.Do(ctxOf(fmt.Sprintf("old-%d", i)), func(context.Context) error { return nil })
	}
	f.Advance(retry.QuotaThrottleWindow + 2*time.Second)
	throttled := map[string]int{}
	for range 2000 {
		for _, c := range []string{"abuser", "gmail"} {
			err := p.Do(ctxOf(c), func(context.Context) error {
				if c == "abuser" {
					return &outcome.Error{Kind: outcome.OutOfQuota}
				}
				return nil
			})
			if oe, ok := outcome.As(err); ok && oe.Local {
				throttled[c]++
			}
		}
		f.Advance(10 * time.Millisecond)
	}
	if throttled["gmail"] != 0 || throttled["abuser"] < 1000 {
		t.Errorf("after %d idle customers: throttled locally %v; want the abuser alone", retry.MaxQuotaThrottles+10, throttled)
	}
}

// A server's Retry-After is honoured only up to the Policy's longest
// backoff (issue 21, item 10): asked to wait an hour before retrying a
// request without a deadline, the Policy gives up at once ("overloaded;
// don't retry", with the server's RetryAfter) instead of holding the
// caller for an hour.
func TestLongRetryAfterEndsTheRetries(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	p, err := retry.New(retry.WithClock(f), retry.WithRandom(func() float64 { return 0.5 }))
	if err != nil {
		t.Fatal(err)
	}
	attempts := 0
	var got error
	done := make(chan struct{})
	go func() {
		defer close(done)
		got = p.Do(criticality.NewContext(context.Background(), criticality.Critical), func(context.Context) error {
			attempts++
			return &outcome.Error{Kind: outcome.TaskOverloaded, RetryAfter: time.Hour}
		})
	}()
	if f.BlockUntil(1, done) {
		for f.BlockUntil(1, done) {
			f.Advance(time.Hour) // let the old behaviour finish
		}
		t.Fatalf("the Policy waited on the clock for the server's hour (attempts %d)", attempts)
	}
	oe, ok := outcome.As(got)
	if attempts != 1 || !ok || oe.Kind != outcome.DontRetry || oe.RetryAfter != time.Hour {
		t.Errorf("%d attempts, %v", attempts, got)
	}
}
