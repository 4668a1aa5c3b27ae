package drill

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
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
