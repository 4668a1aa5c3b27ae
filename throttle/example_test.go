package throttle_test

import (
	"fmt"
	"log"
	"math/rand/v2"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/throttle"
)

// A client sends ten requests a second to a backend that accepts one a
// second and answers the rest "task overloaded": after two minutes of
// history, the throttle rejects most requests locally, before
// they cost the backend anything, and sends about K = 2 times as many as
// the backend accepts: (requests - 2 x accepts) / (requests + 1). Each criticality has its own history.
func Example() {
	clk := clock.NewFake(time.Unix(0, 0)) // clock.Real() in a service
	rnd := rand.New(rand.NewPCG(1, 2))    // the default in a service
	t, err := throttle.New(throttle.WithClock(clk), throttle.WithRandom(rnd.Float64))
	if err != nil {
		log.Fatal(err)
	}
	var lastAccepted time.Time
	for range 1200 {
		if ticket, ok := t.Allow(criticality.Sheddable); ok {
			accepted := clk.Now().Sub(lastAccepted) >= time.Second // the backend's answer
			if accepted {
				lastAccepted = clk.Now()
			}
			ticket.Done(accepted)
		}
		clk.Advance(100 * time.Millisecond)
	}
	s := t.Stats(criticality.Sheddable)
	fmt.Printf("SHEDDABLE: %.0f requests, %.0f accepted: the next rejected locally with probability %.2f\n",
		s.Requests, s.Accepts, s.RejectProbability)
	fmt.Printf("CRITICAL rejected locally with probability %.2f\n", t.Stats(criticality.Critical).RejectProbability)
	// Output:
	// SHEDDABLE: 1200 requests, 64 accepted: the next rejected locally with probability 0.89
	// CRITICAL rejected locally with probability 0.00
}
