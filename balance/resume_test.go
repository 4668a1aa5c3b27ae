package balance

import (
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
)

// The whole subset stops (SIGSTOP of the tier), then resumes, but not at
// one instant: one backend answers first, the others 10-40 ms later.
// What they held through the outage is given up by its callers, so only
// new requests show that they answer. Their silence came before anyone
// served, and they answer well within the stall time once one does: no
// one is ejected, and each takes its share at once, not after an
// ejection (the drill's storm: a tier's tasks ejected their other DB
// tasks this way for a second after SIGCONT, and the one left took their
// traffic).
func TestStaggeredResumptionEjectsNoOne(t *testing.T) {
	const (
		tick   = 10 * time.Millisecond
		outage = 5 * time.Second
	)
	for _, p := range []Policy{RoundRobin, WeightedRoundRobin, LeastLoaded} {
		for _, stagger := range []time.Duration{tick, 40 * time.Millisecond} {
			clk := clock.NewFake(time.Unix(0, 0))
			b, eps := newBalancer(t, clk, 3, WithPolicy(p))
			type call struct {
				e  *Endpoint
				at time.Duration
			}
			var held []call
			start := clk.Now()
			now := func() time.Duration { return clk.Now().Sub(start) }
			resumed := func(e *Endpoint) bool {
				return now() >= outage && (e == eps[0] || now() >= outage+stagger)
			}
			got := map[*Endpoint]int{}
			for now() < outage+time.Second {
				kept := held[:0]
				for _, c := range held {
					switch {
					case now() >= outage:
						c.e.Release() // its caller gave up on it
					case now()-c.at >= time.Second:
						c.e.DoneUnanswered()
					default:
						kept = append(kept, c)
					}
				}
				held = kept
				e, err := b.Pick()
				if err != nil {
					t.Fatalf("%v: %v", p, err)
				}
				if now() >= outage+stagger {
					got[e]++
				}
				if resumed(e) {
					e.Done(false)
				} else {
					held = append(held, call{e, now()})
				}
				clk.Advance(tick)
			}
			for _, e := range eps {
				// Least-loaded also counts the outage's misses as recent
				// errors for a while (WithErrorWindow): only its state.
				if e.State() != Healthy || p != LeastLoaded && got[e] < 20 {
					t.Errorf("%v, resumed %v apart: %s is %v and took %d of the %d requests after the outage, want Healthy and its share", p, stagger, e.ID(), e.State(), got[e], int(time.Second-stagger)/int(tick))
				}
			}
		}
	}
}
