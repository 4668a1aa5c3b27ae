package loadtest

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// drive advances f by step whenever a timer is pending, until stop closes.
func drive(f *clock.Fake, step time.Duration, stop <-chan struct{}) {
	for f.BlockUntil(1, stop) {
		f.Advance(step)
	}
}

func runOnFake(t *testing.T, target Target, opts ...Option) *Result {
	t.Helper()
	f := clock.NewFake(time.Unix(1_000_000, 0))
	r, err := New(target, append([]Option{WithClock(f)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); drive(f, time.Millisecond, stop) }()
	res, err := r.Run(context.Background())
	close(stop)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// byLevel answers by criticality, at once.
var byLevel = TargetFunc(func(ctx context.Context) Outcome {
	switch criticality.Of(ctx) {
	case criticality.SheddablePlus:
		return Overloaded
	case criticality.Sheddable:
		return Failed
	}
	return OK
})

func TestStepsBalanceTheLedgerOnVirtualTime(t *testing.T) {
	res := runOnFake(t, byLevel, WithCapacity(200), WithLoads(0.5, 2), WithStep(time.Second))
	if err := res.Check(); err != nil {
		t.Fatal(err)
	}
	if len(res.Steps) != 2 {
		t.Fatalf("%d steps, want 2", len(res.Steps))
	}
	for i, want := range []int{100, 400} {
		st := res.Steps[i]
		if st.Scheduled != want {
			t.Errorf("step %gx scheduled %d calls, want %d (rate x step)", st.Load, st.Scheduled, want)
		}
		levels := map[criticality.Level]LevelResult{}
		for _, lr := range st.Levels {
			levels[lr.Level] = lr
		}
		crit := levels[criticality.CriticalPlus].Sent + levels[criticality.Critical].Sent
		if st.Outcomes[OK] != crit || st.Outcomes[Overloaded] != levels[criticality.SheddablePlus].Sent || st.Outcomes[Failed] != levels[criticality.Sheddable].Sent {
			t.Errorf("step %gx: outcomes %v do not follow the criticalities %+v", st.Load, st.Outcomes, st.Levels)
		}
		if st.Outcomes[NotSent] != 0 || st.Outcomes[DeadlineExceeded] != 0 {
			t.Errorf("step %gx: %v, want no not-sent or deadline-exceeded", st.Load, st.Outcomes)
		}
		if got, want := st.Goodput, float64(crit)/200; math.Abs(got-want) > 1e-9 {
			t.Errorf("step %gx goodput %v, want %v (successes per second / C)", st.Load, got, want)
		}
		if len(st.Levels) != 4 || st.Levels[0].Level != criticality.CriticalPlus || st.Levels[3].Level != criticality.Sheddable {
			t.Errorf("step %gx by criticality %+v, want the default mix's four levels in order", st.Load, st.Levels)
		}
		ok := 0.0
		for _, sec := range st.Timeline {
			for _, v := range sec.OK {
				ok += v
			}
		}
		if int(math.Round(ok)) != st.Outcomes[OK] {
			t.Errorf("step %gx: the timeline holds %v successes, the step %d", st.Load, ok, st.Outcomes[OK])
		}
	}
	again := runOnFake(t, byLevel, WithCapacity(200), WithLoads(0.5, 2), WithStep(time.Second))
	for i := range res.Steps {
		if res.Steps[i].Outcomes != again.Steps[i].Outcomes {
			t.Errorf("same seed, different draws: %v and %v", res.Steps[i].Outcomes, again.Steps[i].Outcomes)
		}
	}
}

func TestCallsBeyondTheInFlightBoundAreNotSent(t *testing.T) {
	// Calls hang until released, after the step's 50 ms: the step ends
	// with a timer at 50 ms, so when the fake time reaches it every call
	// has been scheduled. The step starts at the fake clock's start,
	// because no timer pends before its first wait
	// (TestStepWaitsOnlyForItsSchedule).
	release := make(chan struct{})
	var mu sync.Mutex
	made := 0
	target := TargetFunc(func(ctx context.Context) Outcome {
		mu.Lock()
		made++
		mu.Unlock()
		<-release
		return OK
	})
	f := clock.NewFake(time.Unix(1_000_000, 0))
	end := f.Now().Add(50 * time.Millisecond)
	r, err := New(target, WithClock(f), WithCapacity(1000), WithLoads(1), WithStep(50*time.Millisecond), WithMaxInFlight(5), WithProbe(time.Second, 4), WithMix([]Share{{criticality.Critical, 1}}))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	go func() {
		for f.BlockUntil(1, stop) {
			f.Advance(time.Millisecond)
			if !f.Now().Before(end) {
				close(release)
				return
			}
		}
	}()
	res, err := r.Run(context.Background())
	close(stop)
	if err != nil {
		t.Fatal(err)
	}
	st := res.Steps[0]
	if st.Scheduled != 50 || st.Outcomes[NotSent] != 45 || st.Outcomes[OK] != 5 || made != 5 {
		t.Fatalf("scheduled %d, outcomes %v, calls made %d; want 50 scheduled, 5 made and OK, 45 not sent", st.Scheduled, st.Outcomes, made)
	}
	if err := res.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestCapacityProbeFindsTheServiceRate(t *testing.T) {
	// One server, 10 ms a call: 100 calls a second however many callers.
	var clk *clock.Fake
	server := make(chan struct{}, 1) // FIFO: blocked senders queue in order
	target := TargetFunc(func(ctx context.Context) Outcome {
		server <- struct{}{}
		defer func() { <-server }()
		tm := clk.NewTimer(10 * time.Millisecond)
		defer tm.Stop()
		select {
		case <-tm.C():
			return OK
		case <-ctx.Done():
			return DeadlineExceeded
		}
	})
	clk = clock.NewFake(time.Unix(1_000_000, 0))
	r, err := New(target, WithClock(clk), WithLoads(1), WithStep(time.Second), WithProbe(time.Second, 64), WithDeadline(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	go drive(clk, time.Millisecond, stop)
	c, points, err := r.Capacity(context.Background())
	close(stop)
	if err != nil {
		t.Fatal(err)
	}
	if c < 95 || c > 105 {
		t.Errorf("capacity %.1f calls/s, want about 100", c)
	}
	if len(points) != 3 || points[0].Workers != 1 || points[2].Workers != 4 {
		t.Errorf("probe steps %+v, want 1, 2 and 4 callers (the rate stops growing after one)", points)
	}
	if p := points[0].P50MS; p < 10 || p > 11 {
		t.Errorf("p50 with one caller %.1f ms, want the 10 ms service time", p)
	}
}

func TestCapacityProbeFailsWithoutSuccesses(t *testing.T) {
	f := clock.NewFake(time.Unix(1_000_000, 0))
	calls := 0
	var mu sync.Mutex
	target := TargetFunc(func(ctx context.Context) Outcome {
		mu.Lock()
		calls++
		mu.Unlock()
		tm := f.NewTimer(time.Millisecond)
		defer tm.Stop()
		<-tm.C()
		return Failed
	})
	r, err := New(target, WithClock(f), WithProbe(100*time.Millisecond, 8))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	go drive(f, time.Millisecond, stop)
	res, err := r.Run(context.Background())
	close(stop)
	if err == nil || !strings.Contains(err.Error(), "no rate the service sustains") {
		t.Fatalf("Run = %v, want the probe's error", err)
	}
	if len(res.Steps) != 0 || len(res.Probe) != 1 {
		t.Errorf("steps %d, probe steps %d; want no load step after a failed probe, one probe step (over 5%% failed)", len(res.Steps), len(res.Probe))
	}
}

func TestNewRefusesBadPlans(t *testing.T) {
	for _, tc := range []struct {
		opts []Option
		want string
	}{
		{[]Option{WithLoads()}, "no load steps"},
		{[]Option{WithLoads(1, -2)}, "positive multiple"},
		{[]Option{WithLoads(math.NaN())}, "positive multiple"},
		{[]Option{WithStep(0)}, "step length"},
		{[]Option{WithDeadline(-time.Second)}, "deadline"},
		{[]Option{WithMaxRate(0)}, "maximum rate"},
		{[]Option{WithMaxRate(math.Inf(1))}, "maximum rate"},
		{[]Option{WithMaxInFlight(0)}, "maximum in flight"},
		{[]Option{WithCapacity(-1)}, "capacity"},
		{[]Option{WithProbe(time.Second, 0)}, "probe"},
		{[]Option{WithProbe(time.Second, 100), WithMaxInFlight(10)}, "exceed the maximum in flight"},
		{[]Option{WithMix(nil)}, "no weight"},
		{[]Option{WithMix([]Share{{criticality.Level(9), 1}})}, "bad mix"},
		{[]Option{WithLoads(1, 2, 3), WithStep(10 * time.Minute), WithMaxRate(100)}, "over its maximum"},
		{[]Option{WithMaxDuration(10 * time.Second)}, "over its maximum"},
		{[]Option{WithMaxRate(1e6), WithLoads(1)}, "a step may hold"},
	} {
		if _, err := New(byLevel, tc.opts...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%d options) = %v, want an error with %q", len(tc.opts), err, tc.want)
		}
	}
	if _, err := New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
	if _, err := New(byLevel); err != nil {
		t.Errorf("New with the defaults: %v", err)
	}
}

func TestParseMix(t *testing.T) {
	mix, err := ParseMix("CRITICAL_PLUS:10, SHEDDABLE:90")
	if err != nil || len(mix) != 2 || mix[0] != (Share{criticality.CriticalPlus, 10}) || mix[1] != (Share{criticality.Sheddable, 90}) {
		t.Fatalf("ParseMix = %v, %v", mix, err)
	}
	for _, bad := range []string{"", "CRITICAL", "CRITICAL:x", "CRITICAL:-1", "CRITICAL:NaN", "CRITICAL:Inf", "NOPE:1", "CRITICAL:1,CRITICAL:2", "CRITICAL:0", "CRITICAL:1,"} {
		if _, err := ParseMix(bad); err == nil {
			t.Errorf("ParseMix(%q) succeeded", bad)
		}
	}
}

func TestPickFollowsTheWeights(t *testing.T) {
	mix := []Share{{criticality.Critical, 1}, {criticality.Sheddable, 3}, {criticality.SheddablePlus, 0}}
	n := map[criticality.Level]int{}
	for i := range 4000 {
		n[pick(mix, float64(i)/4000)]++
	}
	if n[criticality.Critical] != 1000 || n[criticality.Sheddable] != 3000 || n[criticality.SheddablePlus] != 0 {
		t.Fatalf("draws %v, want 1000 CRITICAL and 3000 SHEDDABLE", n)
	}
}

func TestCheckCatchesAnUnbalancedLedger(t *testing.T) {
	res := runOnFake(t, byLevel, WithCapacity(100), WithLoads(1), WithStep(time.Second))
	res.Steps[0].Outcomes[OK]++
	if err := res.Check(); err == nil {
		t.Fatal("Check passed a step with one outcome too many")
	}
}

func TestResultTableAndJSON(t *testing.T) {
	res := runOnFake(t, byLevel, WithCapacity(100), WithLoads(1, 3), WithStep(time.Second), WithMaxRate(250))
	rows := res.Table()
	if len(rows) != 3 || len(rows[0]) != len(rows[1]) {
		t.Fatalf("table %v: want a header and two rows of its width", rows)
	}
	if !strings.Contains(rows[2][0], "capped") || res.Steps[1].OfferedRPS != 250 {
		t.Errorf("3x of 100/s with a maximum of 250/s: row %v, offered %v", rows[2], res.Steps[1].OfferedRPS)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Steps []struct {
			Outcomes map[string]int `json:"outcomes"`
		} `json:"steps"`
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Steps[0].Outcomes["ok"] != res.Steps[0].Outcomes[OK] || back.Steps[0].Outcomes["overloaded"] != res.Steps[0].Outcomes[Overloaded] {
		t.Errorf("JSON outcomes %v, want them by name", back.Steps[0].Outcomes)
	}
}

func TestCheckLoopback(t *testing.T) {
	ctx := context.Background()
	for _, ok := range []string{"127.0.0.1:8080", "127.9.9.9", "[::1]:443", "::1", "localhost:80"} {
		if err := CheckLoopback(ctx, ok); err != nil {
			t.Errorf("CheckLoopback(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"10.0.0.1:80", "192.0.2.7", "[2001:db8::1]:443", "0.0.0.0:80", "[::ffff:10.0.0.1]:80", ""} {
		if err := CheckLoopback(ctx, bad); err == nil {
			t.Errorf("CheckLoopback(%q) accepted a target off this machine", bad)
		}
	}
}

// The probe's decision: a step past the capacity (over 5% of its calls
// failing, or a median over half the deadline) ends the probe and does not
// count, however many calls it got through; a rate that stops growing
// ends it after two steps.
func TestProbeDecision(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []ProbePoint
		best  float64
		ends  int // the step after which the probe is over, -1 for none
	}{
		{"grows then fails", []ProbePoint{{1, 100, 10, 0}, {2, 200, 10, 0}, {4, 320, 12, 0.2}}, 200, 2},
		{"grows then slows", []ProbePoint{{1, 100, 10, 0}, {2, 200, 10, 0}, {4, 380, 600, 0}}, 200, 2},
		{"flat twice", []ProbePoint{{1, 100, 10, 0}, {2, 104, 20, 0}, {4, 103, 40, 0}, {8, 300, 10, 0}}, 104, 2},
		{"flat once, then grows", []ProbePoint{{1, 100, 10, 0}, {2, 104, 20, 0}, {4, 200, 40, 0}}, 200, -1},
		{"fails at once", []ProbePoint{{1, 90, 10, 0.5}}, 0, 0},
		{"five percent is within", []ProbePoint{{1, 90, 10, 0.05}}, 90, -1},
	} {
		var pr probe
		ends := -1
		for i, p := range tc.steps {
			if pr.done(p, time.Second) {
				ends = i
				break
			}
		}
		if pr.best != tc.best || ends != tc.ends {
			t.Errorf("%s: best %v, over after step %d; want %v and %d", tc.name, pr.best, ends, tc.best, tc.ends)
		}
	}
}

// recordingClock records every wait set on its timers.
type recordingClock struct {
	*clock.Fake
	mu    sync.Mutex
	waits []time.Duration
}

func (c *recordingClock) record(d time.Duration) {
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.mu.Unlock()
}

func (c *recordingClock) NewTimer(d time.Duration) clock.Timer {
	c.record(d)
	return recordingTimer{c.Fake.NewTimer(d), c}
}

type recordingTimer struct {
	clock.Timer
	c *recordingClock
}

func (t recordingTimer) Reset(d time.Duration) bool {
	t.c.record(d)
	return t.Timer.Reset(d)
}

func TestStepWaitsOnlyForItsSchedule(t *testing.T) {
	// A test driving a fake clock advances it while a timer is pending; a
	// step must not leave a timer pending for anything but its next send
	// or its end, or the driver moves time under it. Sends fall on whole
	// milliseconds at 1,000 calls a second, not a nanosecond early.
	target := TargetFunc(func(ctx context.Context) Outcome { return OK })
	c := &recordingClock{Fake: clock.NewFake(time.Unix(1_000_000, 0))}
	r, err := New(target, WithClock(c), WithCapacity(1000), WithLoads(1), WithStep(50*time.Millisecond), WithMix([]Share{{criticality.Critical, 1}}))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c.BlockUntil(1, stop) {
			c.Advance(time.Millisecond)
		}
	}()
	res, err := r.Run(context.Background())
	close(stop)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	if st := res.Steps[0]; st.Scheduled != 50 || st.Outcomes[OK] != 50 {
		t.Fatalf("scheduled %d, outcomes %v; want 50 OK", st.Scheduled, st.Outcomes)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.waits {
		if w <= 0 || w > 50*time.Millisecond || w%time.Millisecond != 0 {
			t.Fatalf("the step waited %v on the clock (all waits %v); want only waits of whole milliseconds within its 50 ms", w, c.waits)
		}
	}
}

// Each second of the timeline has the latency of its own successes, so
// that a step's settling shows: a slow first second does not colour the
// next.
func TestTimelineHasEachSecondsLatency(t *testing.T) {
	var samples []sample
	for i := range 100 {
		at := time.Duration(i) * 20 * time.Millisecond // two seconds
		lat := 5 * time.Millisecond
		if at < time.Second {
			lat = 500 * time.Millisecond
		}
		samples = append(samples, sample{at: at, latency: lat, outcome: OK, level: criticality.Critical})
	}
	samples = append(samples, sample{at: 1500 * time.Millisecond, outcome: Overloaded, latency: time.Second})
	st := summarize(samples, 50, 2*time.Second)
	if len(st.Timeline) != 2 {
		t.Fatalf("%d seconds, want 2", len(st.Timeline))
	}
	if got := st.Timeline[0].Latency; got.P50 != 500 || got.P99 != 500 {
		t.Errorf("first second: %+v, want p50 and p99 500 ms", got)
	}
	if got := st.Timeline[1].Latency; got.P50 != 5 || got.P99 != 5 || got.Max != 5 {
		t.Errorf("second second: %+v, want 5 ms throughout (a refusal's time is not a success's latency)", got)
	}
	if st.Latency.Max != 500 || st.Latency.P99 != 500 {
		t.Errorf("the step's latency %+v, want its p99 and max 500 ms", st.Latency)
	}
}

// Each criticality has the latency of its own successes: a service that
// keeps CRITICAL fast while SHEDDABLE waits shows it (issue 56's target
// is on CRITICAL's p50 and p99 against its own at half load).
func TestLevelsHaveTheirOwnLatency(t *testing.T) {
	var samples []sample
	for i := range 100 {
		at := time.Duration(i) * 10 * time.Millisecond
		samples = append(samples,
			sample{at: at, latency: 2 * time.Millisecond, outcome: OK, level: criticality.Critical},
			sample{at: at, latency: 400 * time.Millisecond, outcome: OK, level: criticality.Sheddable},
			sample{at: at, latency: time.Millisecond, outcome: Overloaded, level: criticality.Critical})
	}
	st := summarize(samples, 300, time.Second)
	st.finish(100, []Share{{criticality.Critical, 0.5}, {criticality.Sheddable, 0.5}})
	byLevel := map[criticality.Level]Latency{}
	for _, lr := range st.Levels {
		byLevel[lr.Level] = lr.Latency
	}
	if got := byLevel[criticality.Critical]; got.P50 != 2 || got.P99 != 2 || got.Max != 2 {
		t.Errorf("CRITICAL's latency %+v, want 2 ms throughout (its refusals are no successes)", got)
	}
	if got := byLevel[criticality.Sheddable]; got.P50 != 400 || got.P99 != 400 {
		t.Errorf("SHEDDABLE's latency %+v, want 400 ms", got)
	}
}
