package drill

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/triagehq/triage/internal/measure"
)

// A fault is a failure injected into the stack while it serves, then
// removed: the fault harness (`triage demo -faults NAME,...`). Each fault
// runs as a scenario of three phases at the same load: before (the stack
// settled), the fault's window, and after (has it recovered?).
type fault struct {
	name, says string
	window     time.Duration // how long the fault lasts
	load       float64       // multiple of the provisioned rate, every phase
	// setup, if set, prepares the machine before the stack starts (the
	// partition's network namespace); its error skips the fault.
	setup func(s *stack) (undo func(), err error)
	// inject runs the fault from the window's start and removes it by its
	// end (or when ctx ends): it returns once the fault is removed.
	inject func(ctx context.Context, dr *driver)
}

// Before and after a fault's window, the stack serves the fault's load.
const (
	faultLead  = 8 * time.Second
	faultAfter = 16 * time.Second
)

// faults are the harness's scenarios, in the order they run.
var faults = []*fault{
	{name: "crash", window: 27 * time.Second, load: 1, inject: injectCrash,
		says: "crash: SIGKILL of one task of A, B and the DB in turn, every 3 s, three rounds; each restarted 2 s later"},
	{name: "hang", window: 10 * time.Second, load: 1, inject: injectHang,
		says: "hang: SIGSTOP of db-0 for 10 s (it holds its connections and answers nothing), then SIGCONT"},
	{name: "slow", window: 20 * time.Second, load: 1, inject: injectSlow,
		says: "slow: db-0's handlers 10x slower for 20 s"},
	{name: "partition", window: 10 * time.Second, load: 1, setup: setupPartition, inject: injectPartition,
		says: "partition: the DB tier (in its own network namespace) unreachable from tier B for 10 s"},
	{name: "partition-one", window: 10 * time.Second, load: 1, setup: setupPartitionOne, inject: injectPartition,
		says: "partition of one task: the DB tier unreachable from b-0 for 10 s (the tier above has to notice and avoid b-0)"},
	{name: "quota", window: 10 * time.Second, load: 2, inject: injectQuotaDown,
		says: "quota service down (SIGKILL) for twice its 5 s lease, then back, at 2x load"},
	{name: "restart", window: 30 * time.Second, load: 2, inject: injectRestart,
		says: "rolling restart of every gRPC tier through lame duck, one task per tier at a time, three rounds, at 2x load"},
	{name: "storm", window: 5 * time.Second, load: 1, inject: injectOutage,
		says: "retry-storm trigger: the whole DB tier stopped (SIGSTOP) for 5 s, then back"},
}

// Faults returns the names of the faults the harness knows, in order.
func Faults() []string {
	var out []string
	for _, f := range faults {
		out = append(out, f.name)
	}
	return out
}

// faultScenarios returns the scenarios of the named faults ("all": every
// one), in the harness's order.
func faultScenarios(names []string) ([]*scenario, error) {
	want := map[string]bool{}
	for _, n := range names {
		n = strings.TrimSpace(n)
		if n == "all" {
			for _, f := range faults {
				want[f.name] = true
			}
			continue
		}
		if !slices.Contains(Faults(), n) {
			return nil, fmt.Errorf("drill: unknown fault %q (want all or some of %s)", n, strings.Join(Faults(), ", "))
		}
		want[n] = true
	}
	var out []*scenario
	for _, f := range faults {
		if want[f.name] {
			out = append(out, f.scenario())
		}
	}
	return out, nil
}

func (f *fault) scenario() *scenario {
	x := fmt.Sprintf("%gx the provisioned rate", f.load)
	return &scenario{fault: f, phases: []phase{
		{name: "before", says: "before the fault: " + x, dur: faultLead, load: f.load},
		{name: "fault", says: f.says, dur: f.window, load: f.load},
		{name: "after", says: "the fault removed: " + x, dur: faultAfter, load: f.load},
	}, act: (*driver).actFault}
}

// actFault injects the scenario's fault as its window starts, and records
// when it was injected and removed.
func (dr *driver) actFault(phase string) {
	if phase != "fault" {
		return
	}
	f := dr.sc.fault
	dr.goAction(func() {
		ctx, cancel := context.WithTimeout(dr.runCtx, f.window+15*time.Second) // a stuck action ends with the run
		defer cancel()
		from := time.Since(dr.start).Seconds()
		f.inject(ctx, dr)
		dr.run.faultWindow(from, time.Since(dr.start).Seconds())
	})
}

// wait waits d, and reports false if ctx ended first.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// note records a step of the fault script, at its time in the run.
func (dr *driver) note(format string, a ...any) {
	s := fmt.Sprintf("%.1fs ", time.Since(dr.start).Seconds()) + fmt.Sprintf(format, a...)
	dr.run.note(s)
	dr.v.printf("  %s\n", s)
}

// signal sends sig to p's current process.
func (s *stack) signal(p *proc, sig syscall.Signal) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		cmd.Process.Signal(sig)
	}
}

// injectCrash kills one task of each tier in turn, every 3 s, three
// rounds (task i of each tier in round i); the cluster manager restarts
// each 2 s later.
func injectCrash(ctx context.Context, dr *driver) {
	const every, restartAfter = 3 * time.Second, 2 * time.Second
	began := time.Now()
	var restarts sync.WaitGroup
	defer restarts.Wait()
	for i := range 9 {
		if !wait(ctx, time.Until(began.Add(time.Duration(i)*every))) {
			return
		}
		name := fmt.Sprintf("%s-%d", []string{RoleA, RoleB, RoleDB}[i%3], i/3)
		p := dr.s.byName[name]
		dr.s.stop(p, syscall.SIGKILL)
		dr.note("%s killed (SIGKILL)", name)
		restarts.Add(1)
		go func() {
			defer restarts.Done()
			if wait(ctx, restartAfter) && dr.s.start(p) == nil {
				dr.note("%s started again", name)
			}
		}()
	}
}

// injectHang stops db-0 for the window: a gray failure, its connections
// open and nothing answered.
func injectHang(ctx context.Context, dr *driver) {
	p := dr.s.byName[RoleDB+"-0"]
	dr.s.signal(p, syscall.SIGSTOP)
	dr.note("db-0 stopped (SIGSTOP)")
	defer func() {
		dr.s.signal(p, syscall.SIGCONT)
		dr.note("db-0 continued (SIGCONT)")
	}()
	wait(ctx, dr.sc.fault.window)
}

// injectOutage stops the whole DB tier for the window.
func injectOutage(ctx context.Context, dr *driver) {
	var db []*proc
	for i := range 3 {
		db = append(db, dr.s.byName[fmt.Sprintf("%s-%d", RoleDB, i)])
	}
	for _, p := range db {
		dr.s.signal(p, syscall.SIGSTOP)
	}
	dr.note("the DB tier stopped (SIGSTOP)")
	defer func() {
		for _, p := range db {
			dr.s.signal(p, syscall.SIGCONT)
		}
		dr.note("the DB tier continued (SIGCONT)")
	}()
	wait(ctx, dr.sc.fault.window)
}

// injectSlow makes db-0's handlers SlowFactor times slower for the
// window, through the task's /fault knob; the task restores itself.
func injectSlow(ctx context.Context, dr *driver) {
	p := dr.s.byName[RoleDB+"-0"]
	w := dr.sc.fault.window
	q := url.Values{"slow": {fmt.Sprint(SlowFactor)}, "for": {w.String()}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.stats+"/fault?"+q.Encode(), nil)
	if err != nil {
		dr.note("slow: %v", err)
		return
	}
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		dr.note("slow: %v", err)
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		dr.note("slow: db-0 answered %s", resp.Status)
		return
	}
	dr.note("db-0 %dx slower for %v", SlowFactor, w)
	wait(ctx, w)
	dr.note("db-0 at its speed again")
}

// SlowFactor is how much slower the slow fault makes a task's handlers.
const SlowFactor = 10

// injectQuotaDown kills the quota service and starts it again after the
// window (a new process: it learns the tasks' shares again).
func injectQuotaDown(ctx context.Context, dr *driver) {
	p := dr.s.byName["quota"]
	if p == nil {
		dr.note("no quota service in this run")
		wait(ctx, dr.sc.fault.window)
		return
	}
	dr.s.stop(p, syscall.SIGKILL)
	dr.note("quota service killed (SIGKILL)")
	wait(ctx, dr.sc.fault.window)
	if ctx.Err() == nil && dr.s.start(p) == nil {
		dr.note("quota service started again")
	}
}

// injectRestart restarts every gRPC tier, one task per tier at a time
// (the tiers in parallel, as their own rollouts would), three rounds:
// SIGTERM (lame duck, drain, stop), a new task on the same address, ready
// and 0.5 s of warm-up before the tier's next task goes.
func injectRestart(ctx context.Context, dr *driver) {
	var wg sync.WaitGroup
	for _, role := range []string{RoleA, RoleB, RoleDB} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 3 {
				for i := range 3 {
					p := dr.s.byName[fmt.Sprintf("%s-%d", role, i)]
					if ctx.Err() != nil {
						return
					}
					dr.s.stop(p, syscall.SIGTERM)
					if err := dr.s.start(p); err != nil {
						dr.note("%s did not start again: %v", p.name, err)
						return
					}
					if err := dr.s.ready(ctx, p); err != nil {
						dr.note("%s not ready: %v", p.name, err)
						return
					}
					if !wait(ctx, 500*time.Millisecond) {
						return
					}
				}
				dr.note("tier %s restarted (round %d)", role, round+1)
			}
		}()
	}
	wg.Wait()
}

// FaultRow is one fault run's outcome: result.json's "faults".
type FaultRow struct {
	Fault      string  `json:"fault"`
	Protection bool    `json:"protection"`
	Round      int     `json:"round,omitempty"`
	Rounds     int     `json:"rounds,omitempty"` // in medians: how many
	Load       float64 `json:"load"`
	// Window is when the fault was in place, seconds into the run.
	Window [2]float64 `json:"window_s"`
	// Goodput before, during and after the fault: answered successfully
	// per second, as a share of the provisioned rate (at most 1).
	GoodputBefore float64 `json:"goodput_before"`
	GoodputDuring float64 `json:"goodput_during"`
	GoodputAfter  float64 `json:"goodput_after"`
	// Critical is the share of CRITICAL_PLUS and CRITICAL requests
	// answered successfully, during and after the fault.
	CriticalDuring float64 `json:"critical_during"`
	CriticalAfter  float64 `json:"critical_after"`
	// CriticalLater is that share during the fault less its first second
	// (the time a client has to notice a hung or cut-off task).
	CriticalLater float64 `json:"critical_during_after_1s"`
	// Recovery is the time from the fault's removal to the first of three
	// seconds in a row at goodput 0.95 or more; -1 if that did not happen
	// within the run.
	Recovery float64 `json:"recovery_s"`
	// RecoveryCritical is the time from the fault's removal to the first
	// of three seconds in a row in which 99.9% or more of the
	// CRITICAL_PLUS and CRITICAL requests sent were answered; -1 if that
	// did not happen within the run.
	RecoveryCritical float64 `json:"recovery_critical_s"`
	// Lost is requests with no outcome recorded, Twice those with two,
	// Late those answered past the user's timeout and LedgerSlack (in
	// medians, these counts and TasksDied are totals over the rounds).
	Lost      uint64 `json:"lost"`
	Twice     uint64 `json:"answered_twice"`
	Late      uint64 `json:"late"`
	TasksDied int    `json:"tasks_died"` // besides the fault's own kills
}

// recoverAt is the goodput a second needs for the stack to count as
// recovered after a fault.
const recoverAt = 0.95

// faultRows returns a row per fault run.
func faultRows(runs []*RunResult) []FaultRow {
	var out []FaultRow
	for _, r := range runs {
		if r.Fault == "" {
			continue
		}
		out = append(out, r.faultRow())
	}
	return out
}

func (r *RunResult) faultRow() FaultRow {
	r.mu.Lock()
	defer r.mu.Unlock()
	row := FaultRow{Fault: r.Fault, Protection: r.Protection, Round: r.Round, Window: r.FaultWindow, Recovery: -1, RecoveryCritical: -1,
		Twice: r.Ledger.Twice, Late: r.Ledger.Late, TasksDied: r.TasksDied}
	for _, f := range faults {
		if f.name == r.Fault {
			row.Load = f.load
		}
	}
	for l := range r.Ledger.Sent {
		row.Lost += r.Ledger.Sent[l] - min(r.Ledger.Sent[l], r.Ledger.Answered[l])
	}
	bounds := map[string][2]int{}
	for _, p := range r.Phases {
		bounds[p.Name] = [2]int{int(p.Start), int(p.End)}
		switch p.Name {
		case "before":
			row.GoodputBefore = p.GoodputFrac
		case "fault":
			row.GoodputDuring = p.GoodputFrac
		case "after":
			row.GoodputAfter = p.GoodputFrac
		}
	}
	row.CriticalDuring = r.criticalShare(bounds["fault"])
	row.CriticalLater = r.criticalShare([2]int{bounds["fault"][0] + 1, bounds["fault"][1]})
	row.CriticalAfter = r.criticalShare(bounds["after"])
	// Recovery counts from the second the fault was removed in.
	from := int(r.FaultWindow[1])
	if r.FaultWindow[1] == 0 {
		from = bounds["after"][0]
	}
	row.Recovery = r.recovery(from, func(i int) bool { return r.secondGoodput(i) >= recoverAt })
	row.RecoveryCritical = r.recovery(from, func(i int) bool { return r.criticalShare([2]int{i, i + 1}) >= recoverCriticalAt })
	return row
}

// recoverCriticalAt is the share of CRITICAL_PLUS and CRITICAL requests a
// second needs answered for the stack to count as recovered for them.
const recoverCriticalAt = 0.999

// recovery is the time from the fault's removal to the first of three
// seconds in a row from second from that are good; -1 if none.
func (r *RunResult) recovery(from int, good func(i int) bool) float64 {
	for i := max(from, 0); i+2 < len(r.Seconds); i++ {
		if good(i) && good(i+1) && good(i+2) {
			return max(0, float64(i)-r.FaultWindow[1])
		}
	}
	return -1
}

// secondGoodput is second i's goodput as a share of the provisioned rate.
func (r *RunResult) secondGoodput(i int) float64 {
	n := 0
	for _, v := range r.Seconds[i].OK {
		n += v
	}
	return min(1, float64(n)/ProvisionedRate)
}

// criticalShare is the share of CRITICAL_PLUS and CRITICAL requests sent
// in seconds [b[0], b[1]) that were answered successfully.
func (r *RunResult) criticalShare(b [2]int) float64 {
	var sent, ok int
	for i := max(b[0], 0); i < min(b[1], len(r.Seconds)); i++ {
		for _, l := range []int{2, 3} {
			sent += r.Seconds[i].Sent[l]
			ok += r.Seconds[i].OK[l]
		}
	}
	if sent == 0 {
		return 1
	}
	return float64(ok) / float64(sent)
}

// faultMedians returns, per fault and protection, the medians over the
// rounds.
func faultMedians(rows []FaultRow) []FaultRow {
	type key struct {
		fault   string
		protect bool
	}
	groups := map[key][]FaultRow{}
	var order []key
	for _, r := range rows {
		k := key{r.Fault, r.Protection}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	var out []FaultRow
	for _, k := range order {
		g := groups[k]
		med := func(f func(FaultRow) float64) float64 {
			xs := make([]float64, len(g))
			for i, r := range g {
				xs[i] = f(r)
			}
			return measure.Median(xs)
		}
		m := FaultRow{Fault: k.fault, Protection: k.protect, Rounds: len(g), Load: g[0].Load, Window: g[0].Window,
			GoodputBefore:    med(func(r FaultRow) float64 { return r.GoodputBefore }),
			GoodputDuring:    med(func(r FaultRow) float64 { return r.GoodputDuring }),
			GoodputAfter:     med(func(r FaultRow) float64 { return r.GoodputAfter }),
			CriticalDuring:   med(func(r FaultRow) float64 { return r.CriticalDuring }),
			CriticalAfter:    med(func(r FaultRow) float64 { return r.CriticalAfter }),
			CriticalLater:    med(func(r FaultRow) float64 { return r.CriticalLater }),
			Recovery:         medRecovery(g, func(r FaultRow) float64 { return r.Recovery }),
			RecoveryCritical: medRecovery(g, func(r FaultRow) float64 { return r.RecoveryCritical }),
		}
		for _, r := range g {
			m.Lost += r.Lost
			m.Twice += r.Twice
			m.Late += r.Late
			m.TasksDied += r.TasksDied
		}
		out = append(out, m)
	}
	return out
}

// medRecovery is the median of a recovery time, a run that did not
// recover counting as the longest.
func medRecovery(g []FaultRow, of func(FaultRow) float64) float64 {
	xs := make([]float64, len(g))
	for i, r := range g {
		xs[i] = of(r)
		if xs[i] < 0 {
			xs[i] = 1e9
		}
	}
	sort.Float64s(xs)
	m := measure.Median(xs)
	if m >= 1e9 {
		return -1
	}
	return m
}
