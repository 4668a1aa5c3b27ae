package retry_test

// Virtual-time simulations of the book's client-side claims, running the
// real Policy, Budget and Throttle code against model backends.

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/throttle"
)

// capped accepts at most capacity requests per virtual second, less the
// cost of the rejections it made in the previous second (cost per
// rejection, in units of an accepted request); capacity < 0 accepts all.
type capped struct {
	clock           clock.Clock
	capacity        float64
	rejectCost      float64
	sec             int64
	budget          float64
	rejected, prevR int
	// totals
	attempts, accepts int
}

func (b *capped) Serve(context.Context) error {
	b.attempts++
	if b.capacity < 0 {
		b.accepts++
		return nil
	}
	if s := b.clock.Now().Unix(); s != b.sec {
		b.sec, b.prevR, b.rejected = s, b.rejected, 0
		b.budget = b.capacity - b.rejectCost*float64(b.prevR)
	}
	if b.budget >= 1 {
		b.budget--
		b.accepts++
		return nil
	}
	b.rejected++
	return &outcome.Error{Kind: outcome.TaskOverloaded, Downstream: true}
}

// drive offers rate requests per second, round robin over the policies,
// for d of virtual time, and returns per second how many requests
// succeeded and how many were offered.
func drive(f *clock.Fake, ps []*retry.Policy, rate int, d time.Duration, call retry.Call) (ok, total []int) {
	step := time.Second / time.Duration(rate)
	start := f.Now()
	secs := int(d / time.Second)
	ok, total = make([]int, secs), make([]int, secs)
	for i := 0; time.Duration(i)*step < d; i++ {
		f.Set(start.Add(time.Duration(i) * step))
		s := i * secs / int(d/step)
		total[s]++
		if ps[i%len(ps)].Do(context.Background(), call) == nil {
			ok[s]++
		}
	}
	f.Set(start.Add(d))
	return ok, total
}

func policies(t *testing.T, n int, f *clock.Fake, seed uint64, opts ...retry.Option) []*retry.Policy {
	t.Helper()
	ps := make([]*retry.Policy, n)
	for i := range ps {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		ps[i] = mustNew(t, append([]retry.Option{retry.WithClock(f), retry.WithRandom(rng.Float64), retry.WithBackoff(0, 0)}, opts...)...)
	}
	return ps
}

// The book: with the per-client budget, retries in a total outage grow
// attempts only to 1.1x ("1.1X"); with three attempts and no budget, "just
// below 3X". Every backend rejects; throttling is off so that only the retry
// policy is measured.
func TestRetryGrowthWhenEveryBackendRejects(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     []retry.Option
		min, max float64
	}{
		{"budget", nil, 1.0, 1.12},
		{"no budget", []retry.Option{retry.WithoutBudget()}, 2.7, 3.0},
	} {
		f := clock.NewFake(epoch)
		b := &capped{clock: f, capacity: 0}
		ps := policies(t, 4, f, 1, append([]retry.Option{retry.WithoutThrottle()}, tc.opts...)...)
		_, total := drive(f, ps, 400, 3*time.Minute, b.Serve)
		requests := 0
		for _, n := range total {
			requests += n
		}
		growth := float64(b.attempts) / float64(requests)
		t.Logf("%s: %d requests, %d attempts at the backend: %.3fx", tc.name, requests, b.attempts, growth)
		if growth < tc.min || growth > tc.max {
			t.Errorf("%s: attempts/requests = %.3f, want in [%v, %v]", tc.name, growth, tc.min, tc.max)
		}
	}
}

// With throttling, retries and budgets together (the defaults), clients
// offering 10x make a backend with capacity C reject about one attempt per
// accepted one at K = 2, about 0.1 at K = 1.1.
func TestPolicyEquilibrium(t *testing.T) {
	for _, tc := range []struct {
		k        float64
		min, max float64
	}{{2, 0.8, 1.2}, {1.1, 0.05, 0.15}} {
		f := clock.NewFake(epoch)
		b := &capped{clock: f, capacity: 100}
		ps := make([]*retry.Policy, 2)
		for i := range ps {
			rng := rand.New(rand.NewPCG(3, uint64(i)))
			th, err := throttle.New(throttle.WithK(tc.k), throttle.WithClock(f), throttle.WithRandom(rng.Float64))
			if err != nil {
				t.Fatal(err)
			}
			ps[i] = mustNew(t, retry.WithClock(f), retry.WithRandom(rng.Float64), retry.WithBackoff(0, 0), retry.WithThrottle(th))
		}
		drive(f, ps, 1000, 2*time.Minute, b.Serve)
		a0, acc0 := b.attempts, b.accepts
		drive(f, ps, 1000, 2*time.Minute, b.Serve)
		acc := b.accepts - acc0
		rej := (b.attempts - a0) - acc
		ratio := float64(rej) / float64(acc)
		t.Logf("K=%v: backend accepted %d, rejected %d: %.3f per accept", tc.k, acc, rej, ratio)
		if ratio < tc.min || ratio > tc.max {
			t.Errorf("K=%v: rejected/accepted = %.3f, want in [%v, %v]", tc.k, ratio, tc.min, tc.max)
		}
	}
}

// firstGood returns the first second from which the success ratio stays at
// least 99.9%.
func firstGood(ok, total []int) int {
	for i := range ok {
		good := true
		for j := i; j < len(ok); j++ {
			if float64(ok[j]) < 0.999*float64(total[j]) {
				good = false
				break
			}
		}
		if good {
			return i
		}
	}
	return len(ok)
}

// Recovery: after 30 s at 10x the backend stops rejecting; with the
// defaults, local rejections stop and success is back to 99.9% within 10 s.
func TestRecoveryAfterOverload(t *testing.T) {
	var got []int
	for seed := uint64(1); seed <= 8; seed++ {
		f := clock.NewFake(epoch)
		b := &capped{clock: f, capacity: 100}
		ps := policies(t, 2, f, seed)
		drive(f, ps, 1000, 30*time.Second, b.Serve)
		b.capacity = -1
		ok, total := drive(f, ps, 1000, time.Minute, b.Serve)
		r := firstGood(ok, total)
		got = append(got, r)
		if r > 10 {
			t.Errorf("seed %d: success back to 99.9%% after %d s (per second: %v of %v)", seed, r, ok[:12], total[:12])
		}
		for i, p := range ps {
			if s := p.Throttle().Stats(0); r <= 10 && s.RejectProbability != 0 {
				t.Errorf("seed %d client %d: still rejecting locally with p=%.3f after recovery", seed, i, s.RejectProbability)
			}
		}
	}
	t.Logf("seconds to 99.9%% success after the backend recovered, 8 seeds: %v", got)
}

// The negative control. Two tiers: frontend clients call A, A's clients
// call B; B serves C requests per second and each rejection costs it a
// fifth of a request. Users offer 0.5C, then 10x for 30 s, then 0.5C again.
//
// Naive clients (3 attempts at every layer, no budget, no throttling, and A
// passing "task overloaded" up instead of "don't retry") multiply B's load
// by up to 9 and its rejections eat its capacity: after the spike B stays
// overloaded although users are back at half its capacity (metastable).
// triage clients (defaults, outcome.Upward at A) recover within seconds.
func TestNaiveClientsStayOverloadedTriageRecovers(t *testing.T) {
	type result struct {
		recovered int
		bAttempts int
		afterOK   float64
	}
	run := func(naive bool) result {
		f := clock.NewFake(epoch)
		b := &capped{clock: f, capacity: 100, rejectCost: 0.3}
		opts := []retry.Option{}
		if naive {
			opts = []retry.Option{retry.WithoutBudget(), retry.WithoutThrottle()}
		}
		aClients := policies(t, 2, f, 11, opts...)
		next := 0
		callA := func(ctx context.Context) error {
			p := aClients[next%len(aClients)]
			next++
			err := p.Do(ctx, b.Serve)
			if naive {
				if outcome.Classify(err) != outcome.Success && outcome.Classify(err) != outcome.Failure {
					return &outcome.Error{Kind: outcome.TaskOverloaded, Downstream: true}
				}
				return err
			}
			return outcome.Upward(err)
		}
		front := policies(t, 2, f, 12, opts...)
		drive(f, front, 50, 30*time.Second, callA)
		a0 := b.attempts
		drive(f, front, 1000, 30*time.Second, callA)
		spikeAttempts := b.attempts - a0
		sum := func(xs []int) (s int) {
			for _, x := range xs {
				s += x
			}
			return s
		}
		ok, total := drive(f, front, 50, time.Minute, callA)
		return result{recovered: firstGood(ok, total), bAttempts: spikeAttempts / 30, afterOK: float64(sum(ok)) / float64(sum(total))}
	}
	naive, tri := run(true), run(false)
	t.Logf("naive: B received %d attempts/s during the spike; after it, success 99.9%% after %d s (%.1f%% overall in the minute after)",
		naive.bAttempts, naive.recovered, 100*naive.afterOK)
	t.Logf("triage: B received %d attempts/s during the spike; after it, success 99.9%% after %d s (%.1f%% overall in the minute after)",
		tri.bAttempts, tri.recovered, 100*tri.afterOK)
	if tri.recovered > 10 {
		t.Errorf("triage clients took %d s to recover", tri.recovered)
	}
	if naive.recovered < 60 {
		t.Errorf("the negative control recovered after %d s: the model does not show the failure", naive.recovered)
	}
}
