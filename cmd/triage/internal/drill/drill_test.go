package drill

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/retry"
)

func TestTaskValidate(t *testing.T) {
	good := Task{Role: RoleB, Stats: "127.0.0.1:1", Next: []string{"127.0.0.1:2"}, Slots: 2, Work: 4 * time.Millisecond, MemLimit: 1 << 20}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Task){
		"role":      func(x *Task) { x.Role = "cache" },
		"stats":     func(x *Task) { x.Stats = "" },
		"slots":     func(x *Task) { x.Slots = 65 },
		"work":      func(x *Task) { x.Work = 2 * time.Second },
		"next":      func(x *Task) { x.Next = nil },
		"mem-limit": func(x *Task) { x.MemLimit = 1 },
		"max-conns": func(x *Task) { x.MaxConns = -1 },
	} {
		bad := good
		mod(&bad)
		if bad.Validate() == nil {
			t.Errorf("a bad %s was accepted", name)
		}
	}
	db := good
	db.Role, db.Next = RoleDB, nil
	if err := db.Validate(); err != nil {
		t.Errorf("a DB needs no next tier: %v", err)
	}
}

// Goodput is each second's successes as a share of the provisioned rate,
// at most 1, averaged; by criticality, the share answered.
func TestGoodput(t *testing.T) {
	r := newRun("x", true, nil)
	r.Seconds = []Second{
		{Sent: [4]int{25, 25, 40, 10}, OK: [4]int{25, 25, 40, 10}},     // 100: 1
		{Sent: [4]int{500, 450, 40, 10}, OK: [4]int{100, 100, 40, 10}}, // 250: capped at 1
		{Sent: [4]int{25, 25, 40, 10}, OK: [4]int{0, 0, 20, 10}},       // 30: 0.3
	}
	r.phaseAt("normal", 0)
	r.phaseAt("surge", 2*time.Second)
	r.finish(3 * time.Second)
	if d := r.GoodputFrac - (1+1+0.3)/3; d > 1e-9 || d < -1e-9 {
		t.Errorf("goodput %v", r.GoodputFrac)
	}
	if g := r.GoodputByCriticality["CRITICAL"]; g != 100.0/120 {
		t.Errorf("CRITICAL %v", g)
	}
	if len(r.Phases) != 2 || r.Phases[1].GoodputFrac != 0.3 || r.Phases[0].End != 2 {
		t.Errorf("phases %+v", r.Phases)
	}
	if !strings.Contains((&Result{Runs: []*RunResult{r}}).Summary(), "83.33%") {
		t.Error("the summary lacks CRITICAL's share")
	}
}

// The report stands alone: every figure inline, nothing fetched.
func TestReportIsSelfContained(t *testing.T) {
	r := newRun("with triage", true, []string{"a-0", "db-0", "frontend-0"})
	for i := range 5 {
		s := Second{Sent: [4]int{1, 1, 1, 1}, OK: [4]int{1, 1, 1, 1}, lat: []float64{float64(i + 1)},
			Rejected: map[string]int{"task-overloaded": i}, Util: map[string]float64{"a-0": 0.5, "db-0": 0.9},
			Usage: map[string]float64{"gmail": 1}, Limit: map[string]float64{"gmail": 2},
			spent: tierSpent{RoleFrontend: {"CRITICAL": {N: 1, Downstream: 50}}, RoleDB: {"CRITICAL": {N: 1, Queue: 2, Service: 40}}}}
		r.Seconds = append(r.Seconds, s)
	}
	r.phaseAt("normal", 0)
	r.Attempts = [4]uint64{10, 2, 1, 0}
	r.finish(5 * time.Second)
	html, err := (&Result{ProvisionedRate: ProvisionedRate, Runs: []*RunResult{r}}).Report()
	if err != nil {
		t.Fatal(err)
	}
	page := string(html)
	if n := strings.Count(page, "<svg"); n != 7 {
		t.Errorf("%d figures, want 7 (attempts, goodput, latency, time by tier, failures, utilization, usage)", n)
	}
	if !strings.Contains(page, "where CRITICAL&#39;s time went") || !strings.Contains(page, "between the tiers") {
		t.Error("no figure of where CRITICAL's time went")
	}
	for _, ext := range []string{"<script src", "<link", "<img", `href="http`, "url(http", "@import"} {
		if strings.Contains(page, ext) {
			t.Errorf("the report refers to %q", ext)
		}
	}
}

// The ledger balances only when every request sent was answered once and
// in time, and says what does not balance.
func TestLedgerCheck(t *testing.T) {
	ok := Ledger{Sent: [4]uint64{5, 1, 0, 2}, Answered: [4]uint64{5, 1, 0, 2}}
	if err := ok.Check(); err != nil {
		t.Fatalf("balanced ledger: %v", err)
	}
	for _, tc := range []struct {
		l    Ledger
		want string
	}{
		{Ledger{Sent: [4]uint64{5}, Answered: [4]uint64{4}}, "SHEDDABLE: 5 sent, 4 answered"},
		{Ledger{Sent: [4]uint64{0, 0, 0, 1}, Answered: [4]uint64{0, 0, 0, 2}}, "CRITICAL_PLUS: 1 sent, 2 answered"},
		{Ledger{Twice: 1}, "1 answered twice"},
		{Ledger{Late: 3}, "3 answered more than 250ms past the timeout"},
	} {
		if err := tc.l.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.l, err, tc.want)
		}
	}
}

// With rounds, each run's figures are medians over its rounds, per phase
// too, grouped by protection.
func TestMedians(t *testing.T) {
	run := func(protect bool, g, surge, critical float64, died int) *RunResult {
		return &RunResult{Protection: protect, GoodputFrac: g, TasksDied: died,
			GoodputByCriticality: map[string]float64{"CRITICAL": critical},
			Phases:               []PhaseResult{{Name: "normal", GoodputFrac: 1}, {Name: "surge", GoodputFrac: surge, GoodputByCriticality: map[string]float64{"CRITICAL": critical}}}}
	}
	ms := medians([]*RunResult{
		run(true, 0.9, 0.8, 0.99, 0), run(false, 0.5, 0.3, 0.5, 4),
		run(true, 0.7, 0.95, 1, 1), run(false, 0.6, 0.2, 0.4, 2),
		run(true, 0.95, 0.9, 0.999, 0), run(false, 0.4, 0.1, 0.6, 6),
	})
	if len(ms) != 2 || !ms[0].Protection || ms[1].Protection || ms[0].Rounds != 3 {
		t.Fatalf("medians %+v", ms)
	}
	w := ms[0]
	if w.GoodputFrac != 0.9 || w.TasksDied != 0 || w.GoodputByCriticality["CRITICAL"] != 0.999 ||
		len(w.Phases) != 2 || w.Phases[1].Name != "surge" || w.Phases[1].GoodputFrac != 0.9 || w.Phases[1].GoodputByCriticality["CRITICAL"] != 0.999 {
		t.Errorf("with triage: %+v", w)
	}
	if wo := ms[1]; wo.GoodputFrac != 0.5 || wo.TasksDied != 4 || wo.Phases[1].GoodputFrac != 0.2 {
		t.Errorf("without triage: %+v", wo)
	}
}

// The utilization a task reports to its clients' weighted round robin is
// the share of its slots its requests' work took over the load report's
// window, not the slots busy at the instant a response leaves: that
// instant excludes the finishing request itself, so a machine of two
// slots, always full, would report 0.5 on every answer, and one of four
// 0.75, and weights derived from them favour the smaller machine.
func TestMachineReportsBusyShareOverTheWindow(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	m := newMachine(2, time.Millisecond)
	m.now = clk.Now
	m.lastAt, m.lastRead = clk.Now(), clk.Now()
	meter, err := m.meter(clk)
	if err != nil {
		t.Fatal(err)
	}
	a, b := m.begin(time.Hour), m.begin(time.Hour)
	for range 100 { // both slots held for 2 s, a request answered every 20 ms
		clk.Advance(20 * time.Millisecond)
		meter.Record(false)
		if u := meter.Load().Utilization; u < 0.99 {
			t.Fatalf("always full: reported %.2f as a response leaves", u)
		}
	}
	m.end(a)
	clk.Advance(20 * time.Second)
	if u := meter.Load().Utilization; u < 0.45 || u > 0.55 {
		t.Fatalf("half busy for 20 s: reported %.2f", u)
	}
	m.end(b)
	clk.Advance(15 * time.Second)
	if u := meter.Load().Utilization; u > 0.05 {
		t.Fatalf("idle for 15 s: reported %.2f", u)
	}
}

// Phases start on whole seconds, and a phase is recorded at its scheduled
// start, not at the tick that notices it: the per-second figures then
// belong to one phase each. Before, the drill's 60 s run switched to the
// surge at 7.2 s and recorded it at the next tick, 8.0 s, so the normal
// phase's shares counted the surge's first 0.8 s (SHEDDABLE 29% answered
// "at the provisioned rate").
func TestPhasesStartOnWholeSeconds(t *testing.T) {
	for _, d := range []time.Duration{20 * time.Second, 60 * time.Second, 2 * time.Minute, 97 * time.Second} {
		ends := phaseEnds(drillScenario.phases, d)
		for i, e := range ends {
			if e%time.Second != 0 {
				t.Errorf("%v: phase %d ends at %v, not on a whole second", d, i, e)
			}
		}
		dr := &driver{sc: drillScenario, phaseEnds: ends}
		for i := range ends {
			start := dr.phaseStart(i)
			if dr.phase(start) != i || i > 0 && dr.phase(start-time.Nanosecond) != i-1 {
				t.Errorf("%v: phase %d scheduled from %v, but phase(%v) = %d", d, i, start, start, dr.phase(start))
			}
		}
	}
}

// Latency is kept per criticality: per second, and per phase with the
// worst second's p99, and the summary shows CRITICAL's by phase.
func TestLatencyByCriticality(t *testing.T) {
	r := newRun("x", true, nil)
	r.phaseAt("normal", 0)
	r.phaseAt("surge", 2*time.Second)
	for sec := range 3 {
		el := time.Duration(sec) * time.Second
		for i := 1; i <= 100; i++ {
			crit := time.Duration(i) * time.Millisecond // 1..100 ms
			if sec == 2 {
				crit *= 5 // the surge: 5..500 ms
			}
			r.sent(el, criticality.Critical)
			r.answered(el, criticality.Critical, true, false, "", crit)
			r.sent(el, criticality.Sheddable)
			r.answered(el, criticality.Sheddable, true, false, "", 900*time.Millisecond)
		}
	}
	r.finish(3 * time.Second)
	s := r.Seconds[0].Latency["CRITICAL"]
	if s.N != 100 || s.P50 != 51 || s.P90 != 91 || s.P99 != 100 || s.Max != 100 {
		t.Errorf("second 0, CRITICAL: %+v", s)
	}
	normal, surge := r.Phases[0].Latency["CRITICAL"], r.Phases[1].Latency["CRITICAL"]
	if normal.N != 200 || normal.P99 != 100 || normal.WorstSecondP99 != 100 {
		t.Errorf("normal, CRITICAL: %+v", normal)
	}
	if surge.N != 100 || surge.P50 != 255 || surge.Max != 500 || surge.WorstSecondP99 != 500 {
		t.Errorf("surge, CRITICAL: %+v", surge)
	}
	if sh := r.Phases[0].Latency["SHEDDABLE"]; sh.P50 != 900 {
		t.Errorf("normal, SHEDDABLE: %+v", sh)
	}
	if _, ok := r.Phases[0].Latency["CRITICAL_PLUS"]; ok {
		t.Error("a latency for a criticality nothing was sent at")
	}
	sum := (&Result{Runs: []*RunResult{r}}).Summary()
	if !strings.Contains(sum, "surge") || !strings.Contains(sum, "255 / 500 / 500") {
		t.Errorf("the summary lacks CRITICAL's surge latency:\n%s", sum)
	}
	m := medians([]*RunResult{r, r, r})
	if got := m[0].Phases[1].Latency["CRITICAL"]; got.P50 != 255 || got.WorstSecondP99 != 500 {
		t.Errorf("medians: %+v", got)
	}
}

// TestTimeByTier follows two tasks' cumulative Spent through samples: a
// restart (sums starting again from zero) and the phase split, into
// per-tier means and their medians.
func TestTimeByTier(t *testing.T) {
	r := newRun("x", true, nil)
	r.phaseAt("normal", 0)
	r.phaseAt("surge", 2*time.Second)
	st := func(role string, n int64, queue, service, down float64) Stats {
		return Stats{Role: role, Spent: map[string]Spent{"CRITICAL": {N: n, Queue: queue, Service: service, Downstream: down}}}
	}
	// Seconds 0 and 1: b-0 and b-1 serve 10 requests each per second, 40
	// ms downstream each, no queue. Second 2: b-1 restarted, counting 10
	// requests from zero with 10 ms of queue each.
	r.sample(time.Second, map[string]Stats{"b-0": st(RoleB, 10, 0, 40, 400), "b-1": st(RoleB, 10, 0, 40, 400)})
	r.sample(2*time.Second, map[string]Stats{"b-0": st(RoleB, 20, 0, 80, 800), "b-1": st(RoleB, 20, 0, 80, 800)})
	r.sample(3*time.Second, map[string]Stats{"b-0": st(RoleB, 30, 0, 120, 1200), "b-1": st(RoleB, 10, 100, 40, 400)})
	r.finish(3 * time.Second)
	normal, surge := r.Phases[0].TimeByTier[RoleB]["CRITICAL"], r.Phases[1].TimeByTier[RoleB]["CRITICAL"]
	if normal != (Breakdown{N: 40, Service: 4, Downstream: 40}) {
		t.Errorf("normal: %+v", normal)
	}
	if surge != (Breakdown{N: 20, Queue: 5, Service: 4, Downstream: 40}) {
		t.Errorf("surge, with b-1 restarted: %+v", surge)
	}
	if got := r.Seconds[2].TimeByTier[RoleB]["CRITICAL"]; got != surge {
		t.Errorf("second 2: %+v", got)
	}
	if sum := (&Result{Runs: []*RunResult{r}}).Summary(); !strings.Contains(sum, "5.0 / 0.0 / 4.0 / 40.0 / 0.0") {
		t.Errorf("the summary lacks B's surge breakdown:\n%s", sum)
	}
	if got := medians([]*RunResult{r, r, r})[0].Phases[1].TimeByTier[RoleB]["CRITICAL"]; got != surge {
		t.Errorf("medians: %+v", got)
	}
}

// TestSpendingByCriticality: a task's tracers and handler sum each
// part by criticality; a request without one is counted unlabelled.
func TestSpendingByCriticality(t *testing.T) {
	var s spending
	s.handled(criticality.Critical)
	intakeSpent{&s}.Trace(nil, &intake.Event{Kind: intake.Admitted, Level: criticality.Critical, Wait: 3 * time.Millisecond})
	intakeSpent{&s}.Trace(nil, &intake.Event{Kind: intake.Refused, Level: criticality.Critical, Wait: time.Second})
	retrySpent{&s}.Trace(nil, &retry.Event{Kind: retry.Retried, Level: criticality.Critical, Backoff: 7 * time.Millisecond})
	retrySpent{&s}.Trace(nil, &retry.Event{Kind: retry.Throttled, Level: criticality.Critical, Backoff: time.Second})
	s.add(criticality.Critical, partService, 40*time.Millisecond)
	s.handled(unlabelled)
	s.add(unlabelled, partSlot, 2*time.Millisecond)
	got := s.snapshot()
	if c := got["CRITICAL"]; c != (Spent{N: 1, Queue: 3, Service: 40, Backoff: 7}) {
		t.Errorf("CRITICAL: %+v", c)
	}
	if u := got[Unlabelled]; u != (Spent{N: 1, Slot: 2}) {
		t.Errorf("unlabelled: %+v", u)
	}
	if len(got) != 2 {
		t.Errorf("levels without requests reported: %v", got)
	}
}

// TestHoldReusesRequestMemory: a task holds RequestMemory of real memory
// per request, but does not allocate (and zero) it for every request:
// that cost the drill's host a third of each task's CPU under the surge.
func TestHoldReusesRequestMemory(t *testing.T) {
	tk := &task{cfg: Task{MemLimit: 1 << 30}, died: make(chan struct{})}
	release := tk.hold()
	if tk.memory.Load() != RequestMemory {
		t.Fatalf("held %d bytes, want %d", tk.memory.Load(), RequestMemory)
	}
	release()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const n = 1000
	for range n {
		tk.hold()()
	}
	runtime.ReadMemStats(&after)
	// A collection empties the pool, and the next request allocates a
	// buffer again: a few in a thousand, not one each. Under the race
	// detector the pool drops a quarter of the buffers put back.
	every := int64(16)
	if raceEnabled {
		every = 2
	}
	if per := int64(after.TotalAlloc-before.TotalAlloc) / n; per > RequestMemory/every {
		t.Errorf("%d bytes allocated per request held and released, want at most %d (a buffer every %d requests)", per, RequestMemory/every, every)
	}
	if tk.memory.Load() != 0 {
		t.Errorf("%d bytes still held", tk.memory.Load())
	}
}

// A request is charged the work it did on the machine, never the time a
// frozen process (the storm fault's SIGSTOP) or a busy host kept it
// holding its slot: charged 5 s of CPU for a 40 ms request, every
// customer with a request running when the DB tier stopped was out of
// quota for seconds after it came back.
func TestMachineChargesTheWorkDone(t *testing.T) {
	at := time.Unix(1000, 0)
	m := newMachine(1, time.Nanosecond)
	m.now = func() time.Time { at = at.Add(5 * time.Second); return at } // frozen between any two readings
	held, err := m.run(context.Background(), time.Nanosecond)
	if err != nil || held != time.Nanosecond {
		t.Errorf("held %v (%v), want the 1ns of work", held, err)
	}
	// The quotas charge what the machine's CPU counter (slotTime) says,
	// shared over the requests that ran: it too counts the work done.
	if cpu, _ := m.slotTime(); cpu != time.Nanosecond {
		t.Errorf("the machine's CPU after a 1ns request frozen between readings: %v, want 1ns", cpu)
	}
}

// A request still running counts the work it has done so far, at most
// its own: its slot's time while the machine was frozen is no work.
func TestMachineCountsRunningWorkUpToItsOwn(t *testing.T) {
	at := time.Unix(1000, 0)
	m := newMachine(2, time.Second)
	m.now = func() time.Time { return at }
	f := m.begin(time.Second)
	at = at.Add(300 * time.Millisecond)
	if cpu, _ := m.slotTime(); cpu != 300*time.Millisecond {
		t.Errorf("300ms into a 1s request: %v of CPU, want 300ms", cpu)
	}
	at = at.Add(5 * time.Second) // frozen
	if cpu, _ := m.slotTime(); cpu != time.Second {
		t.Errorf("a 1s request held 5.3s: %v of CPU, want 1s", cpu)
	}
	m.end(f)
	g := m.begin(time.Second)
	at = at.Add(100 * time.Millisecond)
	if cpu, _ := m.slotTime(); cpu != 1100*time.Millisecond {
		t.Errorf("one request done, another 100ms in: %v of CPU, want 1.1s", cpu)
	}
	m.end(g)
}
