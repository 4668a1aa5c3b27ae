package drill

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"
)

// driver runs one run's script beside its load: the actions at phase
// starts, restarts of dead tasks, polling and the live view.
type driver struct {
	s         *stack
	sc        *scenario
	run       *RunResult
	v         *view
	d         time.Duration
	runCtx    context.Context
	start     time.Time
	phaseEnds []time.Duration
	actions   sync.WaitGroup
	restarts  chan string // dead tasks restarted
	restarted chan struct{}
	killed    chan struct{}
	lateOK    bool // Options.LateOK
}

// phaseStart returns when phase i starts.
func (dr *driver) phaseStart(i int) time.Duration {
	if i == 0 {
		return 0
	}
	return dr.phaseEnds[i-1]
}

// phase returns the index of the script's phase at el.
func (dr *driver) phase(el time.Duration) int {
	for i, end := range dr.phaseEnds {
		if el < end {
			return i
		}
	}
	return len(dr.sc.phases) - 1
}

// drive runs the load and the script until the load ends or ctx does.
func (dr *driver) drive(ctx context.Context, lg *load) (*RunResult, error) {
	select {
	case <-time.After(warmup): // the load generator warms the stack up meanwhile
	case <-ctx.Done():
	}
	baseline := dr.s.stats(true)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		lg.run(dr.runCtx, dr.start, func(el time.Duration) float64 {
			if el < 0 || el >= dr.phaseEnds[len(dr.phaseEnds)-1] {
				return 1 // the warm-up
			}
			return dr.sc.phases[dr.phase(el)].load
		}, dr.phaseEnds[len(dr.phaseEnds)-1])
	}()
	curPhase := -1
	for {
		select {
		case <-ctx.Done():
			dr.s.stopAll()
			<-loadDone
			return dr.run, ctx.Err()
		case d := <-dr.s.deaths:
			how := "out of memory"
			if !d.oom {
				how = "crashed; see the tasks' log"
			}
			dr.run.died(d.name+" ("+how+")", time.Since(dr.start))
			dr.v.printf("  %s died (%s); restarting it in 2 s\n", d.name, how)
			dr.restartDead(d.name)
		case name := <-dr.restarts:
			dr.v.printf("  %s restarted\n", name)
		case <-loadDone:
			dr.actions.Wait()
			dr.run.finish(time.Since(dr.start))
			dr.v.printf("== run %q done: goodput %.2f of the provisioned rate, %d task deaths\n", dr.run.Name, dr.run.GoodputFrac, dr.run.TasksDied)
			lg.close() // its idle connections are the generator's, not the frontend's
			dr.run.Residue = dr.settle(ctx, baseline)
			var errs []string
			check := dr.run.Ledger.Check
			if dr.lateOK {
				check = dr.run.Ledger.Balance
			}
			if err := check(); err != nil {
				errs = append(errs, err.Error())
			}
			for _, r := range dr.run.Residue {
				if !r.Settled() {
					errs = append(errs, r.String())
				}
			}
			if len(errs) > 0 {
				return dr.run, fmt.Errorf("%w: run %q: %s", errChecks, dr.run.Name, strings.Join(errs, "; "))
			}
			return dr.run, nil
		case <-tick.C:
			el := time.Since(dr.start)
			ph := dr.phase(el)
			if ph != curPhase {
				curPhase = ph
				p := dr.sc.phases[ph]
				dr.run.phaseAt(p.name, dr.phaseStart(ph))
				dr.v.printf("-- %5.1fs  %s\n", el.Seconds(), p.says)
				dr.sc.act(dr, p.name)
			}
			dr.s.poll(dr.run, el)
			dr.v.show(dr.run, dr.sc.phases[ph].name, el, dr.d)
		}
	}
}

// settleWithin bounds the wait, after a run's load, for every task to
// return to its baseline.
const settleWithin = 15 * time.Second

// settle waits until every task's goroutines and live heap are back to
// their baseline (read after the warm-up, before the load), or
// settleWithin passes, and returns the last reading of each task.
func (dr *driver) settle(ctx context.Context, baseline map[string]Stats) []Residue {
	deadline := time.Now().Add(settleWithin)
	for {
		now := dr.s.stats(true)
		var out []Residue
		settled := true
		for _, name := range sortedKeys(baseline) {
			b, a := baseline[name], now[name]
			r := Residue{Task: name, Goroutines: [2]int{b.Goroutines, a.Goroutines}, LiveHeap: [2]uint64{b.LiveHeap, a.LiveHeap}, Read: a.ID != ""}
			settled = settled && r.Settled()
			out = append(out, r)
		}
		if settled || time.Now().After(deadline) || ctx.Err() != nil {
			return out
		}
		select {
		case <-time.After(500 * time.Millisecond): // polling real processes
		case <-ctx.Done():
		}
	}
}

// actDrill starts the action of an overload drill's phase, beside the
// load.
func (dr *driver) actDrill(phase string) {
	s, run := dr.s, dr.run
	switch phase {
	case "restart":
		dr.goAction(func() {
			defer close(dr.restarted)
			s.rollingRestart(dr.runCtx, RoleB, dr.v, run, dr.start)
		})
	case "kill":
		// After the rolling restart, as the script says: a short drill's
		// restart can outlast its phase.
		dr.goAction(func() {
			defer close(dr.killed)
			if !dr.after(dr.restarted) {
				return
			}
			s.stop(s.byName["db-0"], syscall.SIGKILL)
			run.note(fmt.Sprintf("%.1fs db-0 killed (SIGKILL)", time.Since(dr.start).Seconds()))
		})
	case "recovery":
		dr.goAction(func() {
			if !dr.after(dr.killed) {
				return
			}
			if err := s.start(s.byName["db-0"]); err == nil {
				run.note(fmt.Sprintf("%.1fs db-0 started again", time.Since(dr.start).Seconds()))
			}
		})
	}
}

func (dr *driver) goAction(f func()) {
	dr.actions.Add(1)
	go func() {
		defer dr.actions.Done()
		f()
	}()
}

// after waits for ch, and reports false if the run ended first.
func (dr *driver) after(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-dr.runCtx.Done():
		return false
	}
}

// restartDead restarts a dead task 2 s later, as a cluster manager would.
func (dr *driver) restartDead(name string) {
	dr.goAction(func() {
		select {
		case <-time.After(2 * time.Second): // the cluster manager notices and reschedules
		case <-dr.runCtx.Done():
			return
		}
		p := dr.s.byName[name]
		if p == nil || dr.runCtx.Err() != nil || p.alive() {
			return
		}
		if err := dr.s.start(p); err == nil {
			dr.restarts <- name
		}
	})
}
