package loadtest

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/measure"
)

// Result is what a run measured.
type Result struct {
	// Target names what was tested, for people (set by the caller).
	Target string `json:"target,omitempty"`
	// Capacity is C, in calls per second: probed (CapacityProbed) or given.
	Capacity       float64      `json:"capacity_rps"`
	CapacityProbed bool         `json:"capacity_probed"`
	Probe          []ProbePoint `json:"probe,omitempty"`
	DeadlineMS     float64      `json:"deadline_ms"`
	Mix            []Share      `json:"mix"`
	Steps          []Step       `json:"steps"`
}

// Step is one load step's figures.
type Step struct {
	// Load is the step's multiple of the capacity; OfferedRPS the rate
	// offered, lower than Load x C when RateCapped by the maximum rate.
	Load       float64 `json:"load"`
	OfferedRPS float64 `json:"offered_rps"`
	RateCapped bool    `json:"rate_capped,omitempty"`
	Seconds    float64 `json:"seconds"`
	// Scheduled is the calls the step scheduled; each has one outcome.
	Scheduled int              `json:"scheduled"`
	Outcomes  [NumOutcomes]int `json:"-"`
	Goodput   float64          `json:"goodput"` // successes per second / C
	Levels    []LevelResult    `json:"by_criticality"`
	Latency   Latency          `json:"latency_ms"` // of the successes, from their scheduled send
	LateSends int              `json:"late_sends"` // sent more than 10 ms behind schedule
	MaxLagMS  float64          `json:"max_send_lag_ms"`
	Timeline  []Second         `json:"timeline"`
	samples   []sample         // dropped by finish
	levelOK   [criticality.NumLevels]int
	levelN    [criticality.NumLevels]int
	levelLat  [criticality.NumLevels]Latency
}

// MarshalJSON writes the outcomes by name.
func (s Step) MarshalJSON() ([]byte, error) {
	type plain Step
	out := map[string]int{}
	for o, n := range s.Outcomes {
		out[Outcome(o).String()] = n
	}
	return json.Marshal(struct {
		plain
		Outcomes map[string]int `json:"outcomes"`
	}{plain(s), out})
}

// LevelResult is one criticality's part of a step.
type LevelResult struct {
	Level criticality.Level `json:"criticality"`
	Sent  int               `json:"scheduled"`
	OK    int               `json:"ok"`
	// Success is OK / Sent; Goodput is successes per second / C.
	Success float64 `json:"success"`
	Goodput float64 `json:"goodput"`
	// Latency is of this criticality's successes, from their scheduled
	// send.
	Latency Latency `json:"latency_ms"`
}

// Latency holds percentiles, in milliseconds.
type Latency struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Second is one second of a step (by scheduled send time): successes per
// second of each criticality, and the latency of that second's successes,
// so that a step's settling shows.
type Second struct {
	At      float64                        `json:"at_s"`
	OK      [criticality.NumLevels]float64 `json:"ok_per_second"`
	Latency Latency                        `json:"latency_ms"`
}

func summarize(samples []sample, rate float64, d time.Duration) Step {
	st := Step{OfferedRPS: rate, Seconds: d.Seconds(), Scheduled: len(samples), samples: samples}
	var lat []float64
	var byLevel [criticality.NumLevels][]float64
	secs := int(d/time.Second) + 1
	tl := make([]Second, secs)
	perSec := make([][]float64, secs)
	for i := range tl {
		tl[i].At = float64(i)
	}
	for _, s := range samples {
		st.Outcomes[s.outcome]++
		st.levelN[s.level]++
		if s.lag > 10*time.Millisecond {
			st.LateSends++
		}
		st.MaxLagMS = max(st.MaxLagMS, ms(s.lag))
		if s.outcome == OK {
			st.levelOK[s.level]++
			lat = append(lat, ms(s.latency))
			byLevel[s.level] = append(byLevel[s.level], ms(s.latency))
			i := min(int(s.at/time.Second), secs-1)
			tl[i].OK[s.level]++
			perSec[i] = append(perSec[i], ms(s.latency))
		}
	}
	for i, l := range perSec {
		tl[i].Latency = latencyOf(l)
	}
	// The last second may be partial: rate it over what it covered.
	if last := d - time.Duration(secs-1)*time.Second; last > 0 {
		for l := range tl[secs-1].OK {
			tl[secs-1].OK[l] /= last.Seconds()
		}
	} else {
		tl = tl[:secs-1]
	}
	st.Timeline = tl
	st.Latency = latencyOf(lat)
	for l, v := range byLevel {
		st.levelLat[l] = latencyOf(v)
	}
	return st
}

// latencyOf sorts lat and returns its percentiles.
func latencyOf(lat []float64) Latency {
	if len(lat) == 0 {
		return Latency{}
	}
	slices.Sort(lat)
	return Latency{P50: measure.Quantile(lat, 0.5), P90: measure.Quantile(lat, 0.9), P99: measure.Quantile(lat, 0.99), Max: lat[len(lat)-1]}
}

// finish computes the figures against capacity c.
func (st *Step) finish(c float64, mix []Share) {
	st.samples = nil
	if st.Seconds > 0 && c > 0 {
		st.Goodput = float64(st.Outcomes[OK]) / st.Seconds / c
	}
	for _, sh := range mix {
		l := sh.Level
		lr := LevelResult{Level: l, Sent: st.levelN[l], OK: st.levelOK[l], Latency: st.levelLat[l]}
		if lr.Sent > 0 {
			lr.Success = float64(lr.OK) / float64(lr.Sent)
		}
		if st.Seconds > 0 && c > 0 {
			lr.Goodput = float64(lr.OK) / st.Seconds / c
		}
		st.Levels = append(st.Levels, lr)
	}
}

func (st *Step) outcomeLine() string {
	var parts []string
	for o, n := range st.Outcomes {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", Outcome(o), n))
		}
	}
	return strings.Join(parts, ", ")
}

// Check verifies the ledger: every scheduled call has exactly one outcome
// and one criticality, and the successes add up.
func (r *Result) Check() error {
	for _, st := range r.Steps {
		total, ok, sent := 0, 0, 0
		for _, n := range st.Outcomes {
			total += n
		}
		for _, lr := range st.Levels {
			ok += lr.OK
			sent += lr.Sent
		}
		if total != st.Scheduled || sent != st.Scheduled || ok != st.Outcomes[OK] {
			return fmt.Errorf("loadtest: step %gx does not balance: %d scheduled, %d outcomes, %d by criticality, %d successes of %d", st.Load, st.Scheduled, total, sent, ok, st.Outcomes[OK])
		}
	}
	return nil
}

// Table returns the result as rows of text, the first row the header: one
// row per step with goodput (of C) overall and per criticality of the mix,
// latency percentiles of the successes, and calls by outcome.
func (r *Result) Table() [][]string {
	head := []string{"load", "offered/s", "goodput"}
	for _, sh := range r.Mix {
		head = append(head, sh.Level.String())
	}
	head = append(head, "p50 ms", "p90 ms", "p99 ms")
	for o := range NumOutcomes {
		head = append(head, Outcome(o).String())
	}
	head = append(head, "late sends")
	rows := [][]string{head}
	for _, st := range r.Steps {
		load := fmt.Sprintf("%gx", st.Load)
		if st.RateCapped {
			load += " (capped)"
		}
		row := []string{load, fmt.Sprintf("%.0f", st.OfferedRPS), fmt.Sprintf("%.2f", st.Goodput)}
		for _, lr := range st.Levels {
			row = append(row, fmt.Sprintf("%.2f (%.0f%%)", lr.Goodput, 100*lr.Success))
		}
		row = append(row, fmt.Sprintf("%.1f", st.Latency.P50), fmt.Sprintf("%.1f", st.Latency.P90), fmt.Sprintf("%.1f", st.Latency.P99))
		for _, n := range st.Outcomes {
			row = append(row, fmt.Sprint(n))
		}
		row = append(row, fmt.Sprint(st.LateSends))
		rows = append(rows, row)
	}
	return rows
}
