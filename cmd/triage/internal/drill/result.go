package drill

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/measure"
)

// Result is what a drill measured: result.json.
type Result struct {
	ProvisionedRate float64      `json:"provisioned_rate"`
	Runs            []*RunResult `json:"runs"`
	// Medians are, with more than one round, each run's figures as
	// medians over the rounds: with triage first.
	Medians []Median `json:"medians,omitempty"`
	// Faults are the fault harness's runs, a row each; FaultMedians, with
	// more than one round, the medians per fault and protection. Skipped
	// names the faults this machine could not inject, and why.
	Faults       []FaultRow `json:"faults,omitempty"`
	FaultMedians []FaultRow `json:"fault_medians,omitempty"`
	Skipped      []string   `json:"skipped,omitempty"`
	// ShadowRows, with Options.Shadow, compare what the run in shadow
	// would have refused with what the run with triage refused, on the
	// same load, by mechanism, reason and criticality (summed over rounds).
	ShadowRows []ShadowRow `json:"shadow,omitempty"`
	Dir        string      `json:"-"`
}

// ShadowRow is one mechanism, reason and criticality's refusals under
// enforcement and would-be refusals in shadow.
type ShadowRow struct {
	Mechanism   string `json:"mechanism"`
	Reason      string `json:"reason"`
	Criticality string `json:"criticality"`
	Refused     int    `json:"refused"`      // by the run with triage
	WouldRefuse int    `json:"would_refuse"` // by the run in shadow
}

// Median is one run's figures, each the median over the rounds.
type Median struct {
	Protection           bool               `json:"protection"`
	Rounds               int                `json:"rounds"`
	GoodputFrac          float64            `json:"goodput_frac"`
	GoodputByCriticality map[string]float64 `json:"goodput_by_criticality"`
	TasksDied            float64            `json:"tasks_died"`
	Phases               []PhaseResult      `json:"phases"`
}

// medians returns the medians of the runs, grouped by protection.
func medians(runs []*RunResult) []Median {
	var out []Median
	for _, protect := range []bool{true, false} {
		var rs []*RunResult
		for _, r := range runs {
			if r.Protection == protect && !r.Shadow {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			continue
		}
		m := Median{Protection: protect, Rounds: len(rs)}
		m.GoodputFrac = medianOf(rs, func(r *RunResult) float64 { return r.GoodputFrac })
		m.TasksDied = medianOf(rs, func(r *RunResult) float64 { return float64(r.TasksDied) })
		m.GoodputByCriticality = medianByLevel(rs, func(r *RunResult) map[string]float64 { return r.GoodputByCriticality })
		for i, p := range rs[0].Phases {
			ph := PhaseResult{Name: p.Name, Start: p.Start, End: p.End}
			ok := func(r *RunResult) bool { return i < len(r.Phases) && r.Phases[i].Name == p.Name }
			var with []*RunResult
			for _, r := range rs {
				if ok(r) {
					with = append(with, r)
				}
			}
			ph.GoodputFrac = medianOf(with, func(r *RunResult) float64 { return r.Phases[i].GoodputFrac })
			ph.GoodputByCriticality = medianByLevel(with, func(r *RunResult) map[string]float64 { return r.Phases[i].GoodputByCriticality })
			ph.Latency = medianLatency(with, func(r *RunResult) map[string]Latency { return r.Phases[i].Latency })
			ph.TimeByTier = medianSpent(with, func(r *RunResult) map[string]map[string]Breakdown { return r.Phases[i].TimeByTier })
			m.Phases = append(m.Phases, ph)
		}
		out = append(out, m)
	}
	return out
}

// medianLatency is, per criticality, the median over rs of each figure
// of f's latencies.
func medianLatency(rs []*RunResult, f func(*RunResult) map[string]Latency) map[string]Latency {
	out := map[string]Latency{}
	for _, l := range criticality.All() {
		var got []Latency
		for _, r := range rs {
			if lat, ok := f(r)[l.String()]; ok {
				got = append(got, lat)
			}
		}
		if len(got) == 0 {
			continue
		}
		of := func(g func(Latency) float64) float64 {
			xs := make([]float64, len(got))
			for i, lat := range got {
				xs[i] = g(lat)
			}
			return measure.Median(xs)
		}
		out[l.String()] = Latency{N: int(of(func(x Latency) float64 { return float64(x.N) })),
			P50: of(func(x Latency) float64 { return x.P50 }), P90: of(func(x Latency) float64 { return x.P90 }),
			P99: of(func(x Latency) float64 { return x.P99 }), Max: of(func(x Latency) float64 { return x.Max }),
			WorstSecondP99: of(func(x Latency) float64 { return x.WorstSecondP99 })}
	}
	return out
}

// medianSpent is, per tier and criticality, the median over rs of each
// part of f's breakdowns.
func medianSpent(rs []*RunResult, f func(*RunResult) map[string]map[string]Breakdown) map[string]map[string]Breakdown {
	got := map[string]map[string][]Breakdown{}
	for _, r := range rs {
		for role, by := range f(r) {
			if got[role] == nil {
				got[role] = map[string][]Breakdown{}
			}
			for l, b := range by {
				got[role][l] = append(got[role][l], b)
			}
		}
	}
	out := map[string]map[string]Breakdown{}
	for role, by := range got {
		out[role] = map[string]Breakdown{}
		for l, bs := range by {
			of := func(g func(Breakdown) float64) float64 {
				xs := make([]float64, len(bs))
				for i, b := range bs {
					xs[i] = g(b)
				}
				return measure.Median(xs)
			}
			out[role][l] = Breakdown{N: int64(of(func(b Breakdown) float64 { return float64(b.N) })),
				Queue: of(func(b Breakdown) float64 { return b.Queue }), Slot: of(func(b Breakdown) float64 { return b.Slot }),
				Service: of(func(b Breakdown) float64 { return b.Service }), Downstream: of(func(b Breakdown) float64 { return b.Downstream }),
				Backoff: of(func(b Breakdown) float64 { return b.Backoff })}
		}
	}
	return out
}

func medianOf(rs []*RunResult, f func(*RunResult) float64) float64 {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	return measure.Median(xs)
}

func medianByLevel(rs []*RunResult, f func(*RunResult) map[string]float64) map[string]float64 {
	by := map[string][]float64{}
	for _, r := range rs {
		for k, v := range f(r) {
			by[k] = append(by[k], v)
		}
	}
	out := map[string]float64{}
	for k, xs := range by {
		out[k] = measure.Median(xs)
	}
	return out
}

// RunResult is one run of the script.
type RunResult struct {
	Name       string `json:"name"`
	Protection bool   `json:"protection"`
	Shadow     bool   `json:"shadow,omitempty"` // triage's stack with every mechanism in shadow
	Round      int    `json:"round,omitempty"`  // with more than one round, from 1
	// Fault is the fault this run injected ("": the overload drill), and
	// FaultWindow when it was in place, seconds into the run.
	Fault       string     `json:"fault,omitempty"`
	FaultWindow [2]float64 `json:"fault_window_s,omitempty"`
	// GoodputFrac is the mean, over the run's seconds, of the requests
	// answered successfully in that second, as a share of the provisioned
	// rate (at most 1 a second).
	GoodputFrac float64 `json:"goodput_frac"`
	// GoodputByCriticality is, per level, the share of its requests
	// answered successfully over the whole run.
	GoodputByCriticality map[string]float64 `json:"goodput_by_criticality"`
	TasksDied            int                `json:"tasks_died"`
	Deaths               []string           `json:"deaths,omitempty"`
	Phases               []PhaseResult      `json:"phases"`
	// Attempts is the histogram of attempt numbers the DB tasks received
	// (0: first attempts).
	Attempts [4]uint64 `json:"db_attempts"`
	Notes    []string  `json:"notes,omitempty"`
	Seconds  []Second  `json:"seconds"`
	// Ledger accounts for every request the run sent.
	Ledger Ledger `json:"ledger"`
	// Residue is, per task, what it held before the load and after it:
	// the run fails unless every task returned to its baseline.
	Residue []Residue `json:"residue,omitempty"`

	mu        sync.Mutex
	tasks     []string
	lastAtt   map[string][4]uint64
	lastRej   map[string]map[string]int64 // per task, its cumulative refusals at the last sample
	lastSpent map[string]map[string]Spent // per task, its Spent at the last sample
	phaseIdx  []int                       // the second each phase starts
}

// Ledger is a run's account of its requests (the warm-up's aside), by
// criticality: every request sent is answered exactly once (a response,
// an overload outcome, or the user giving up at the timeout), and none is
// answered more than LedgerSlack after the user's timeout.
type Ledger struct {
	Sent     [4]uint64 `json:"sent"`
	Answered [4]uint64 `json:"answered"`
	Twice    uint64    `json:"answered_twice"`
	Late     uint64    `json:"late"`
	// LateAnswers describes the first late answers (at most maxLate):
	// when the request was sent, how long its answer took, and what it
	// was.
	LateAnswers []string `json:"late_answers,omitempty"`
}

// maxLate bounds Ledger.LateAnswers.
const maxLate = 8

// Residue is one task's goroutines and live heap (after a collection) at
// its baseline, after the warm-up, and after the run's load.
type Residue struct {
	Task       string    `json:"task"`
	Goroutines [2]int    `json:"goroutines"`
	LiveHeap   [2]uint64 `json:"live_heap"`
	Read       bool      `json:"read"` // its stats answered after the load
}

// What a task may hold beyond its baseline after a run and still count
// as returned to it: a few goroutines (a connection re-established to a
// restarted task, a health-check stream) and a few MiB of live heap
// (tables bounded by design: throttles, usage, subsets).
const (
	GoroutineSlack = 8
	LiveHeapSlack  = 8 << 20
)

// Settled reports whether the task returned to its baseline.
func (r Residue) Settled() bool {
	return r.Read && r.Goroutines[1] <= r.Goroutines[0]+GoroutineSlack && r.LiveHeap[1] <= r.LiveHeap[0]+LiveHeapSlack
}

func (r Residue) String() string {
	if !r.Read {
		return r.Task + ": no stats after the load"
	}
	return fmt.Sprintf("%s: %d goroutines and %.1f MiB live heap after the load, %d and %.1f MiB before",
		r.Task, r.Goroutines[1], float64(r.LiveHeap[1])/(1<<20), r.Goroutines[0], float64(r.LiveHeap[0])/(1<<20))
}

// LedgerSlack is how long past the user's timeout an answer may come.
const LedgerSlack = 250 * time.Millisecond

// Check returns what does not balance, or nil: every request sent
// answered once, none more than LedgerSlack past the user's timeout.
func (l Ledger) Check() error { return l.check(true) }

// Balance is Check without the lateness: every request sent answered once.
func (l Ledger) Balance() error { return l.check(false) }

func (l Ledger) check(late bool) error {
	var errs []string
	for lv := range l.Sent {
		if l.Sent[lv] != l.Answered[lv] {
			errs = append(errs, fmt.Sprintf("%v: %d sent, %d answered", criticality.Level(lv), l.Sent[lv], l.Answered[lv]))
		}
	}
	if l.Twice > 0 {
		errs = append(errs, fmt.Sprintf("%d answered twice", l.Twice))
	}
	if late && l.Late > 0 {
		errs = append(errs, fmt.Sprintf("%d answered more than %v past the timeout (%s)", l.Late, LedgerSlack, strings.Join(l.LateAnswers, ", ")))
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// PhaseResult is one phase of a run.
type PhaseResult struct {
	Name                 string             `json:"name"`
	Start                float64            `json:"start_s"`
	End                  float64            `json:"end_s"`
	GoodputFrac          float64            `json:"goodput_frac"`
	GoodputByCriticality map[string]float64 `json:"goodput_by_criticality"`
	// Latency is the latency of the phase's successful requests, by
	// criticality, with the worst of its seconds' p99s.
	Latency map[string]Latency `json:"latency_by_criticality,omitempty"`
	// TimeByTier is where the time went in each tier ("frontend", "a",
	// "b", "db"), by criticality: the mean per request of each part.
	TimeByTier map[string]map[string]Breakdown `json:"time_by_tier,omitempty"`
}

// Latency is a distribution of successful requests' latencies, in ms.
type Latency struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
	// WorstSecondP99 is, over a phase, the highest p99 of its seconds
	// (0 for a second's own Latency).
	WorstSecondP99 float64 `json:"worst_second_p99_ms,omitempty"`
}

// latencyOf is the distribution of xs (sorted in place); zero when empty.
func latencyOf(xs []float64) Latency {
	if len(xs) == 0 {
		return Latency{}
	}
	sort.Float64s(xs)
	at := func(q float64) float64 { return xs[min(len(xs)-1, int(q*float64(len(xs))))] }
	return Latency{N: len(xs), P50: at(0.5), P90: at(0.9), P99: at(0.99), Max: xs[len(xs)-1]}
}

// Second is what happened in one second of a run (requests by the second
// they were sent in).
type Second struct {
	Sent     [4]int         `json:"sent"` // by criticality.Level
	OK       [4]int         `json:"ok"`
	Degraded int            `json:"degraded"`
	P50      float64        `json:"p50_ms,omitempty"` // of successes
	P99      float64        `json:"p99_ms,omitempty"`
	Rejected map[string]int `json:"rejected,omitempty"`
	// CriticalRejected is the failures of CRITICAL_PLUS and CRITICAL
	// requests, by reason (also counted in Rejected).
	CriticalRejected map[string]int     `json:"critical_rejected,omitempty"`
	Util             map[string]float64 `json:"util,omitempty"`  // per task
	Usage            map[string]float64 `json:"usage,omitempty"` // per customer, DB tier
	Limit            map[string]float64 `json:"limit,omitempty"`
	// Refused is what the tasks refused or lost in this second, by tier
	// and reason ("db admission concurrency SHEDDABLE", "a throttled
	// SHEDDABLE", "db out-of-quota CRITICAL calendar on db-2"): where a
	// rejection the user saw was decided.
	Refused map[string]int `json:"refused,omitempty"`
	// Admission is each task's admission state, read at the second's end.
	Admission map[string]AdmissionStats `json:"admission,omitempty"`
	// Latency is the latency of this second's successful requests by
	// criticality.
	Latency map[string]Latency `json:"latency_by_criticality,omitempty"`
	// TimeByTier is where this second's requests spent their time in
	// each tier, by criticality (from the tasks' stats read at its end).
	TimeByTier map[string]map[string]Breakdown `json:"time_by_tier,omitempty"`
	spent      tierSpent
	lat        []float64
	latBy      [criticality.NumLevels][]float64 // each bounded by maxLatencies
}

func newRun(name string, protect bool, tasks []string) *RunResult {
	return &RunResult{Name: name, Protection: protect, tasks: tasks, lastAtt: map[string][4]uint64{}, lastRej: map[string]map[string]int64{},
		lastSpent: map[string]map[string]Spent{}}
}

// maxLatencies bounds the latencies kept per second.
const maxLatencies = 4096

func (r *RunResult) second(el time.Duration) *Second {
	i := int(el / time.Second)
	for len(r.Seconds) <= i {
		r.Seconds = append(r.Seconds, Second{Rejected: map[string]int{}})
	}
	return &r.Seconds[i]
}

func (r *RunResult) sent(el time.Duration, l criticality.Level) {
	r.mu.Lock()
	r.second(el).Sent[l]++
	r.Ledger.Sent[l]++
	r.mu.Unlock()
}

// answeredTwice counts a request answered a second time.
func (r *RunResult) answeredTwice() {
	r.mu.Lock()
	r.Ledger.Twice++
	r.mu.Unlock()
}

func (r *RunResult) answered(el time.Duration, l criticality.Level, ok, degraded bool, reason string, took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Ledger.Answered[l]++
	if took > requestTimeout+LedgerSlack {
		r.Ledger.Late++
		if len(r.Ledger.LateAnswers) < maxLate {
			what := reason
			if ok {
				what = "OK"
			}
			r.Ledger.LateAnswers = append(r.Ledger.LateAnswers, fmt.Sprintf("%v sent at %.2fs took %v: %s", l, el.Seconds(), took.Round(time.Millisecond), what))
		}
	}
	s := r.second(el)
	if ok {
		s.OK[l]++
		if degraded {
			s.Degraded++
		}
		ms := float64(took) / float64(time.Millisecond)
		if len(s.lat) < maxLatencies {
			s.lat = append(s.lat, ms)
		}
		if l.Valid() && len(s.latBy[l]) < maxLatencies {
			s.latBy[l] = append(s.latBy[l], ms)
		}
		return
	}
	if len(s.Rejected) < 16 || s.Rejected[reason] > 0 {
		s.Rejected[reason]++
	}
	if l >= criticality.Critical {
		if s.CriticalRejected == nil {
			s.CriticalRejected = map[string]int{}
		}
		if len(s.CriticalRejected) < 16 || s.CriticalRejected[reason] > 0 {
			s.CriticalRejected[reason]++
		}
	}
}

func (r *RunResult) died(name string, el time.Duration) {
	r.mu.Lock()
	r.TasksDied++
	if len(r.Deaths) < 100 {
		r.Deaths = append(r.Deaths, fmt.Sprintf("%.1fs %s", el.Seconds(), name))
	}
	r.mu.Unlock()
}

func (r *RunResult) note(s string) {
	r.mu.Lock()
	if len(r.Notes) < 100 {
		r.Notes = append(r.Notes, s)
	}
	r.mu.Unlock()
}

func (r *RunResult) faultWindow(from, to float64) {
	r.mu.Lock()
	r.FaultWindow = [2]float64{from, to}
	r.mu.Unlock()
}

func (r *RunResult) phaseAt(name string, el time.Duration) {
	r.mu.Lock()
	r.Phases = append(r.Phases, PhaseResult{Name: name, Start: el.Seconds()})
	r.phaseIdx = append(r.phaseIdx, int(el/time.Second))
	r.mu.Unlock()
}

// sample records the tasks' stats in the current second.
func (r *RunResult) sample(el time.Duration, stats map[string]Stats) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.second(el - time.Second/2) // the second the stats mostly cover
	s.Util, s.Usage, s.Limit = map[string]float64{}, map[string]float64{}, map[string]float64{}
	for name, st := range stats {
		if st.Slots > 0 {
			s.Util[name] = st.Busy / float64(st.Slots)
		}
		for c, u := range st.Usage {
			s.Usage[c] += u
		}
		for c, l := range st.Limit {
			s.Limit[c] += l
		}
		r.refused(s, name, st)
		r.spentSince(s, name, st)
		if st.Admission != nil {
			if s.Admission == nil {
				s.Admission = map[string]AdmissionStats{}
			}
			s.Admission[name] = *st.Admission
		}
		if st.Role == RoleDB {
			last := r.lastAtt[name]
			for i, v := range st.Attempts {
				d := v - last[i]
				if v < last[i] { // restarted: counting from zero
					d = v
				}
				r.Attempts[i] += d
			}
			r.lastAtt[name] = st.Attempts
		}
	}
}

// refused adds a task's refusals since its last sample to s.
func (r *RunResult) refused(s *Second, name string, st Stats) {
	last := r.lastRej[name]
	for reason, v := range st.Rejected {
		d := v - last[reason]
		if v < last[reason] { // restarted: counting from zero
			d = v
		}
		if d == 0 {
			continue
		}
		if s.Refused == nil {
			s.Refused = map[string]int{}
		}
		key := st.Role + " " + reason
		if len(s.Refused) < 256 || s.Refused[key] > 0 {
			s.Refused[key] += int(d)
		}
	}
	r.lastRej[name] = st.Rejected
}

// spentSince adds where a task's requests spent their time since its
// last sample to s, under its tier.
func (r *RunResult) spentSince(s *Second, name string, st Stats) {
	last := r.lastSpent[name]
	for l, v := range st.Spent {
		if d := v.since(last[l]); d.N > 0 {
			if s.spent == nil {
				s.spent = tierSpent{}
			}
			s.spent.add(st.Role, l, d)
		}
	}
	r.lastSpent[name] = st.Spent
}

// finish computes the headline figures.
func (r *RunResult) finish(el time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := int(el / time.Second)
	if len(r.Seconds) > n {
		r.Seconds = r.Seconds[:n] // a last partial second would read low
	}
	for i := range r.Seconds {
		s := &r.Seconds[i]
		if len(s.lat) > 0 {
			slices.Sort(s.lat)
			s.P50, s.P99 = measure.Quantile(s.lat, 0.5), measure.Quantile(s.lat, 0.99)
		}
		s.TimeByTier = s.spent.means()
		for _, l := range criticality.All() {
			if len(s.latBy[l]) > 0 {
				if s.Latency == nil {
					s.Latency = map[string]Latency{}
				}
				s.Latency[l.String()] = latencyOf(s.latBy[l])
			}
		}
	}
	for i := range r.Phases {
		end := len(r.Seconds)
		if i+1 < len(r.phaseIdx) {
			end = r.phaseIdx[i+1]
		}
		r.Phases[i].End = float64(end)
		ss := r.Seconds[min(r.phaseIdx[i], end):end]
		r.Phases[i].GoodputFrac, r.Phases[i].GoodputByCriticality = goodput(ss)
		r.Phases[i].Latency = phaseLatency(ss)
		r.Phases[i].TimeByTier = phaseSpent(ss)
	}
	r.GoodputFrac, r.GoodputByCriticality = goodput(r.Seconds)
}

// phaseSpent is where ss's requests spent their time, by tier and
// criticality.
func phaseSpent(ss []Second) map[string]map[string]Breakdown {
	sum := tierSpent{}
	for i := range ss {
		for role, by := range ss[i].spent {
			for l, sp := range by {
				sum.add(role, l, sp)
			}
		}
	}
	return sum.means()
}

// phaseLatency is the latency of ss's successful requests by
// criticality, with the worst second's p99.
func phaseLatency(ss []Second) map[string]Latency {
	out := map[string]Latency{}
	for _, l := range criticality.All() {
		var xs []float64
		worst := 0.0
		for i := range ss {
			xs = append(xs, ss[i].latBy[l]...)
			worst = max(worst, ss[i].Latency[l.String()].P99)
		}
		if len(xs) > 0 {
			lat := latencyOf(xs)
			lat.WorstSecondP99 = worst
			out[l.String()] = lat
		}
	}
	return out
}

func goodput(ss []Second) (float64, map[string]float64) {
	var frac float64
	var sent, ok [4]int
	for _, s := range ss {
		total := 0
		for l := range s.OK {
			total += s.OK[l]
			sent[l] += s.Sent[l]
			ok[l] += s.OK[l]
		}
		frac += math.Min(1, float64(total)/ProvisionedRate)
	}
	if len(ss) > 0 {
		frac /= float64(len(ss))
	}
	by := map[string]float64{}
	for l := range sent {
		if sent[l] > 0 {
			by[criticality.Level(l).String()] = float64(ok[l]) / float64(sent[l])
		}
	}
	return frac, by
}

func (res *Result) write(dir string) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "result.json"), b, 0o644); err != nil {
		return err
	}
	html, err := res.Report()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.html"), html, 0o644)
}

// Summary is the table comparing the runs.
func (res *Result) Summary() string {
	if len(res.Faults) > 0 || len(res.Skipped) > 0 {
		return res.faultSummary()
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "run\tgoodput/provisioned\tCRITICAL_PLUS\tCRITICAL\tSHEDDABLE_PLUS\tSHEDDABLE\ttask deaths\tDB attempts 0/1/2/3")
	for _, r := range res.Runs {
		g := r.GoodputByCriticality
		fmt.Fprintf(w, "%s\t%.2f\t%s\t%s\t%s\t%s\t%d\t%d/%d/%d/%d\n", r.Name, r.GoodputFrac,
			pct(g, "CRITICAL_PLUS"), pct(g, "CRITICAL"), pct(g, "SHEDDABLE_PLUS"), pct(g, "SHEDDABLE"), r.TasksDied,
			r.Attempts[0], r.Attempts[1], r.Attempts[2], r.Attempts[3])
	}
	w.Flush()
	b.WriteString("\nby phase (goodput/provisioned; CRITICAL_PLUS and CRITICAL answered):\n")
	w = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprint(w, "run")
	if len(res.Runs) > 0 {
		for _, p := range res.Runs[0].Phases {
			fmt.Fprintf(w, "\t%s", p.Name)
		}
	}
	fmt.Fprintln(w)
	for _, r := range res.Runs {
		fmt.Fprint(w, r.Name)
		for _, p := range r.Phases {
			fmt.Fprintf(w, "\t%.2f; %s %s", p.GoodputFrac, pct(p.GoodputByCriticality, "CRITICAL_PLUS"), pct(p.GoodputByCriticality, "CRITICAL"))
		}
		fmt.Fprintln(w)
	}
	w.Flush()
	for _, m := range res.Medians {
		name := "with triage"
		if !m.Protection {
			name = "without triage"
		}
		fmt.Fprintf(&b, "\n%s, medians of %d rounds: goodput %.2f, CRITICAL_PLUS %s, CRITICAL %s, task deaths %g\n",
			name, m.Rounds, m.GoodputFrac, pct(m.GoodputByCriticality, "CRITICAL_PLUS"), pct(m.GoodputByCriticality, "CRITICAL"), m.TasksDied)
		w = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		for _, p := range m.Phases {
			fmt.Fprintf(w, "  %s\t%.2f; %s %s\n", p.Name, p.GoodputFrac, pct(p.GoodputByCriticality, "CRITICAL_PLUS"), pct(p.GoodputByCriticality, "CRITICAL"))
		}
		w.Flush()
		latencySummary(&b, m.Phases)
		spentSummary(&b, m.Phases)
	}
	if len(res.Medians) == 0 {
		for _, r := range res.Runs {
			fmt.Fprintf(&b, "\n%s:", r.Name)
			latencySummary(&b, r.Phases)
			spentSummary(&b, r.Phases)
		}
	}
	res.shadowSummary(&b)
	return b.String()
}

// latencySummary writes, per phase, the latency of CRITICAL_PLUS and
// CRITICAL successes: p50, p99 and the worst second's p99, in ms.
func latencySummary(b *strings.Builder, phases []PhaseResult) {
	b.WriteString("  latency by phase, ms (p50 / p99 / worst second's p99):\n")
	w := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  phase\tCRITICAL_PLUS\tCRITICAL\tSHEDDABLE_PLUS\tSHEDDABLE")
	for _, p := range phases {
		fmt.Fprintf(w, "  %s", p.Name)
		for _, l := range []string{"CRITICAL_PLUS", "CRITICAL", "SHEDDABLE_PLUS", "SHEDDABLE"} {
			if lat, ok := p.Latency[l]; ok {
				fmt.Fprintf(w, "\t%.0f / %.0f / %.0f", lat.P50, lat.P99, lat.WorstSecondP99)
			} else {
				fmt.Fprint(w, "\t-")
			}
		}
		fmt.Fprintln(w)
	}
	w.Flush()
}

// spentSummary writes, per phase and tier, where CRITICAL requests spent
// their time (a tier without triage past the frontend: all its
// requests, unlabelled), in mean ms per request.
func spentSummary(b *strings.Builder, phases []PhaseResult) {
	b.WriteString("  where CRITICAL's time went, mean ms per request (queue / machine slot / service / downstream / backoff):\n")
	w := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	roles := []string{RoleFrontend, RoleA, RoleB, RoleDB}
	fmt.Fprintf(w, "  phase\t%s\n", strings.Join(roles, "\t"))
	for _, p := range phases {
		fmt.Fprintf(w, "  %s", p.Name)
		for _, role := range roles {
			sp, ok := p.TimeByTier[role]["CRITICAL"]
			if !ok {
				sp, ok = p.TimeByTier[role][Unlabelled]
			}
			if !ok {
				fmt.Fprint(w, "\t-")
				continue
			}
			fmt.Fprintf(w, "\t%.1f / %.1f / %.1f / %.1f / %.1f", sp.Queue, sp.Slot, sp.Service, sp.Downstream, sp.Backoff)
		}
		fmt.Fprintln(w)
	}
	w.Flush()
}

// shadowSummary writes the shadow comparison, if there is one.
func (res *Result) shadowSummary(b *strings.Builder) {
	if len(res.ShadowRows) == 0 {
		return
	}
	b.WriteString("\nshadow (same load): what triage refused, and what it would have refused in shadow:\n")
	w := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "mechanism\treason\tcriticality\trefused, with triage\twould refuse, in shadow")
	for _, r := range res.ShadowRows {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\n", r.Mechanism, r.Reason, r.Criticality, r.Refused, r.WouldRefuse)
	}
	w.Flush()
}

// faultSummary is the fault harness's table: a row per run (per fault
// and protection with medians).
func (res *Result) faultSummary() string {
	var b strings.Builder
	table := func(rows []FaultRow) {
		w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "fault\trun\tload\tgoodput before/during/after\tCRITICAL* during/after\trecovery\tCRITICAL* recovery\tlost/twice/late\ttask deaths")
		for _, r := range rows {
			name := "with triage"
			if !r.Protection {
				name = "without triage"
			}
			if r.Round > 0 {
				name += fmt.Sprintf(", round %d", r.Round)
			}
			if r.Rounds > 0 {
				name += fmt.Sprintf(", medians of %d", r.Rounds)
			}
			rec := func(s float64) string {
				if s < 0 {
					return "none"
				}
				return fmt.Sprintf("%.0f s", s)
			}
			fmt.Fprintf(w, "%s\t%s\t%gx\t%.2f / %.2f / %.2f\t%.2f%% (%.2f%%) / %.2f%%\t%s\t%s\t%d/%d/%d\t%d\n", r.Fault, name, r.Load,
				r.GoodputBefore, r.GoodputDuring, r.GoodputAfter, 100*r.CriticalDuring, 100*r.CriticalLater, 100*r.CriticalAfter,
				rec(r.Recovery), rec(r.RecoveryCritical), r.Lost, r.Twice, r.Late, r.TasksDied)
		}
		w.Flush()
	}
	b.WriteString("faults (goodput: share of the provisioned rate; CRITICAL*: CRITICAL_PLUS and CRITICAL answered,\n" +
		"during the fault (after its first second) / after it;\n" +
		"recovery: from the fault's removal to three seconds in a row at goodput >= 0.95;\n" +
		"CRITICAL* recovery: to three seconds in a row with >= 99.9% of CRITICAL* answered):\n")
	table(res.Faults)
	if len(res.FaultMedians) > 0 {
		b.WriteString("\nmedians over the rounds (lost, twice, late and deaths: totals):\n")
		table(res.FaultMedians)
	}
	for _, s := range res.Skipped {
		fmt.Fprintf(&b, "\n%s\n", s)
	}
	return b.String()
}

func pct(m map[string]float64, k string) string {
	v, ok := m[k]
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.2f%%", 100*v)
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// compareShadow sums, over the drill's runs with triage and its runs in
// shadow, the refusals of each mechanism by reason and criticality,
// read from the tiers' refusal counts ("db admission concurrency
// SHEDDABLE", "a throttled CRITICAL", "db out-of-quota SHEDDABLE gmail on
// db-0"; in shadow "db would admission concurrency SHEDDABLE"). Nil
// without a run in shadow.
func compareShadow(runs []*RunResult) []ShadowRow {
	type key struct{ m, r, l string }
	rows := map[key]*ShadowRow{}
	any := false
	for _, run := range runs {
		if !run.Protection || run.Fault != "" {
			continue
		}
		any = any || run.Shadow
		for _, sec := range run.Seconds {
			for k, n := range sec.Refused {
				m, r, l, would, ok := parseRefusal(k)
				if !ok || would != run.Shadow {
					continue
				}
				row := rows[key{m, r, l}]
				if row == nil {
					row = &ShadowRow{Mechanism: m, Reason: r, Criticality: l}
					rows[key{m, r, l}] = row
				}
				if would {
					row.WouldRefuse += n
				} else {
					row.Refused += n
				}
			}
		}
	}
	if !any {
		return nil
	}
	out := make([]ShadowRow, 0, len(rows))
	for _, row := range rows {
		out = append(out, *row)
	}
	slices.SortFunc(out, func(a, b ShadowRow) int {
		return cmp.Or(cmp.Compare(a.Mechanism, b.Mechanism), cmp.Compare(a.Reason, b.Reason), levelOrder(a.Criticality)-levelOrder(b.Criticality))
	})
	return out
}

// parseRefusal reads a tier's refusal key as a mechanism's: its
// mechanism, reason and criticality, and whether it is a would-be
// refusal in shadow. Refusals that are no mechanism's (a deadline, a
// downstream failure) are not.
func parseRefusal(k string) (mechanism, reason, level string, would, ok bool) {
	f := strings.Fields(k)
	if len(f) < 3 {
		return "", "", "", false, false
	}
	f = f[1:] // the tier
	if f[0] == "would" {
		if len(f) != 4 {
			return "", "", "", false, false
		}
		return f[1], f[2], f[3], true, true
	}
	switch {
	case f[0] == "admission" && len(f) == 3:
		return "admission", f[1], f[2], false, true
	case f[0] == "throttled" && len(f) == 2:
		return "throttle", "throttled", f[1], false, true
	case f[0] == "retry" && len(f) == 3 && f[1] == "budget":
		return "retry-budget", "retry-budget", f[2], false, true
	case f[0] == "out-of-quota" && len(f) >= 2:
		return "quota", "out-of-quota", f[1], false, true
	}
	return "", "", "", false, false
}

// levelOrder orders criticality names from CRITICAL_PLUS down.
func levelOrder(name string) int {
	l, err := criticality.Parse(name)
	if err != nil {
		return -1
	}
	return criticality.NumLevels - int(l)
}
