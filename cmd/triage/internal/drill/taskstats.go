package drill

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"runtime/metrics"
	"strconv"
	"time"

	"github.com/triagehq/triage/criticality"
)

// slowdown is the factor the slow fault multiplies the work by now (1
// without it).
func (t *task) slowdown() int64 {
	if time.Now().UnixNano() < t.slowUntil.Load() {
		return max(1, t.slowBy.Load())
	}
	return 1
}

// MaxSlowFactor and MaxSlowFor bound the slow fault: its factor and how
// long it lasts.
const (
	MaxSlowFactor = 100
	MaxSlowFor    = 5 * time.Minute
)

// serveFault is the task's fault knob, for the drill's fault harness on
// its stats address: POST /fault?slow=F&for=D makes the handlers F times
// slower for D (F 1 restores the speed at once); POST
// /fault?shed=LEVEL:FRACTION:DURATION starts a ForceShed drill (FRACTION 0
// is not accepted: a drill ends at its time, or replaced by a shorter one).
func (t *task) serveFault(w http.ResponseWriter, r *http.Request) {
	if spec := r.URL.Query().Get("shed"); spec != "" {
		d, err := ParseForceShed(spec)
		if err == nil && t.ctl == nil {
			err = errors.New("no admission control on this task")
		}
		if err == nil {
			err = t.ctl.ForceShed(d.Level, d.Fraction, d.For)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%s: force-shedding %.0f%% of %v for %v\n", t.cfg.ID, 100*d.Fraction, d.Level, d.For)
		return
	}
	f, err := strconv.Atoi(r.URL.Query().Get("slow"))
	if err != nil || f < 1 || f > MaxSlowFactor {
		http.Error(w, fmt.Sprintf("slow must be an integer in [1, %d]", MaxSlowFactor), http.StatusBadRequest)
		return
	}
	d, err := time.ParseDuration(r.URL.Query().Get("for"))
	if err != nil || d <= 0 || d > MaxSlowFor {
		http.Error(w, fmt.Sprintf("for must be a duration in (0, %v]", MaxSlowFor), http.StatusBadRequest)
		return
	}
	t.slowBy.Store(int64(f))
	t.slowUntil.Store(time.Now().Add(d).UnixNano())
	fmt.Fprintf(w, "%s: handlers %dx slower for %v\n", t.cfg.ID, f, d)
}

func (t *task) serveStats(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("gc") == "1" {
		runtime.GC() // twice: the first moves the buffers hold keeps for reuse aside, the second frees them
		runtime.GC()
	}
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	s := Stats{ID: t.cfg.ID, Role: t.cfg.Role, Slots: t.cfg.Slots, Busy: t.mach.utilization() * float64(t.cfg.Slots),
		Served: t.served.Load(), Degraded: t.degraded.Load(), Memory: t.memory.Load(), Rejected: map[string]int64{},
		Goroutines: runtime.NumGoroutine(), Spent: t.spent.snapshot()}
	if live[0].Value.Kind() == metrics.KindUint64 {
		s.LiveHeap = live[0].Value.Uint64()
	}
	for i := range s.Attempts {
		s.Attempts[i] = t.attempts[i].Load()
	}
	t.rejMu.Lock()
	for k, v := range t.rejected {
		s.Rejected[k] = v
	}
	t.rejMu.Unlock()
	if t.ctl != nil {
		a := t.ctl.Stats()
		s.Admission = &AdmissionStats{PendingCap: a.PendingCap, Pending: a.Pending, Limit: a.Limit, Saturated: a.Saturated}
		for l, f := range a.Forced {
			if f > 0 {
				if s.Admission.ForceShed == nil {
					s.Admission.ForceShed = map[string]float64{}
				}
				s.Admission.ForceShed[criticality.Level(l).String()] = f
			}
		}
	}
	if t.enf != nil {
		s.Usage, s.Limit = map[string]float64{}, map[string]float64{}
		for _, c := range t.enf.Usage().Snapshot() {
			var used float64
			for _, v := range c.Used {
				used += v
			}
			s.Usage[c.Customer] = used
		}
		for c := range apiKeys {
			name := apiKeys[c]
			if lim, _ := t.leased.Limit(name, criticality.Sheddable); lim < 1e9 {
				s.Limit[name] = lim
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(s)
}
