package drill

import (
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/measure"
)

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
