package drill

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/triagehq/triage/criticality"
)

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
