package app

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/triagehq/triage/cmd/triage/internal/drill"
)

// asCLI makes this test binary the triage command, so that the drill can
// start its tasks and the quota service from it.
const asCLI = "TRIAGE_TEST_AS_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(asCLI) == "1" {
		os.Exit(runProcess(os.Args[1:]))
	}
	// Before any test dials: grpc-go's balancer registry must not change
	// while a ClientConn runs (the tests run commands in parallel).
	registerBalancer()
	os.Exit(m.Run())
}

// A shortened drill (a minute), end to end, on real processes: both runs, and the
// headline figures of result.json. With triage, no task dies and the stack
// does better than without, where the same traffic kills tasks or
// collapses goodput. The promise's numbers (CRITICAL_PLUS and CRITICAL
// answered, the provisioned rate served through the surge and the
// restart) are shares measured over wall-clock seconds: they are asserted
// with TRIAGE_MEASURE=1, on a machine the drill has to itself (.ci/run
// runs it so), not inside go test ./..., where other packages' tests
// share the CPU with its processes.
func TestDrillShortened(t *testing.T) {
	if testing.Short() || raceEnabled || os.Getenv("TRIAGE_MEASURE") != "1" {
		t.Skip("a 60 s drill on real processes, with its numbers asserted: TRIAGE_MEASURE=1 go test -run TestDrillShortened ./cmd/triage/app (.ci/run runs it so, alone on the machine, without the race detector)")
	}
	t.Setenv(asCLI, "1")
	dir := t.TempDir()
	var out bytes.Buffer
	args := []string{"demo", "-duration", "60s", "-quiet", "-out", dir}
	measure := os.Getenv("TRIAGE_MEASURE") == "1"
	if !measure {
		// Answers past the user's timeout are the load generator's lateness
		// on a CPU other packages' tests share: asserted when measuring.
		args = append(args, "-late-ok")
	}
	code := run(context.Background(), args, &out, &out)
	t.Log(out.String()[max(0, out.Len()-2500):])
	if code != 0 {
		t.Fatalf("triage demo exited %d", code)
	}
	var res struct {
		ProvisionedRate float64 `json:"provisioned_rate"`
		Runs            []struct {
			Name       string             `json:"name"`
			Protection bool               `json:"protection"`
			Goodput    float64            `json:"goodput_frac"`
			ByLevel    map[string]float64 `json:"goodput_by_criticality"`
			Died       int                `json:"tasks_died"`
			Phases     []struct {
				Name    string             `json:"name"`
				Goodput float64            `json:"goodput_frac"`
				ByLevel map[string]float64 `json:"goodput_by_criticality"`
			} `json:"phases"`
			Attempts [4]uint64 `json:"db_attempts"`
			Seconds  []struct {
				CriticalRejected map[string]int `json:"critical_rejected"`
			} `json:"seconds"`
			Residue []struct {
				Task       string    `json:"task"`
				Goroutines [2]int    `json:"goroutines"`
				LiveHeap   [2]uint64 `json:"live_heap"`
				Read       bool      `json:"read"`
			} `json:"residue"`
			Ledger struct {
				Sent     [4]uint64 `json:"sent"`
				Answered [4]uint64 `json:"answered"`
				Twice    uint64    `json:"answered_twice"`
				Late     uint64    `json:"late"`
			} `json:"ledger"`
		} `json:"runs"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "result.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 2 || !res.Runs[0].Protection || res.Runs[1].Protection || res.ProvisionedRate != 100 {
		t.Fatalf("result.json: %d runs, provisioned %v", len(res.Runs), res.ProvisionedRate)
	}
	// The ledger balances in both runs: every request sent was answered
	// once and, when measuring, none later than 250 ms past the user's
	// timeout.
	for _, r := range res.Runs {
		l := r.Ledger
		if l.Sent != l.Answered || l.Twice != 0 || measure && l.Late != 0 || l.Sent == [4]uint64{} {
			t.Errorf("%s: ledger %+v does not balance", r.Name, l)
		}
	}
	// After each run, every task's goroutines and live heap are back to
	// their baseline (within the drill's slack).
	for _, r := range res.Runs {
		if len(r.Residue) != 10 {
			t.Errorf("%s: residue of %d tasks, want 10", r.Name, len(r.Residue))
		}
		for _, x := range r.Residue {
			if !x.Read || x.Goroutines[1] > x.Goroutines[0]+drill.GoroutineSlack || x.LiveHeap[1] > x.LiveHeap[0]+drill.LiveHeapSlack {
				t.Errorf("%s: %s did not return to its baseline: %+v", r.Name, x.Task, x)
			}
		}
	}
	with, without := res.Runs[0], res.Runs[1]
	if len(with.Phases) != 5 || with.Attempts[0] == 0 {
		t.Errorf("with triage: %d phases, DB attempts %v", len(with.Phases), with.Attempts)
	}
	if with.Died != 0 {
		t.Errorf("with triage, %d tasks died", with.Died)
	}
	for _, l := range []string{"CRITICAL_PLUS", "CRITICAL"} {
		if os.Getenv("TRIAGE_MEASURE") == "1" && with.ByLevel[l] < 0.99 {
			t.Errorf("with triage, %s answered %.2f%%", l, 100*with.ByLevel[l])
			for i, s := range with.Seconds {
				if len(s.CriticalRejected) > 0 {
					t.Logf("second %d: critical requests failed: %v", i, s.CriticalRejected)
				}
			}
		}
	}
	// The book's promise: under excess load the stack keeps serving its
	// provisioned rate.
	for _, p := range with.Phases {
		if os.Getenv("TRIAGE_MEASURE") == "1" && (p.Name == "surge" || p.Name == "restart") && p.Goodput < 0.9 {
			t.Errorf("with triage, goodput %.2f of the provisioned rate in the %s phase", p.Goodput, p.Name)
		}
	}
	if without.Died == 0 && without.Goodput > 0.7 {
		t.Errorf("without triage the surge neither killed a task nor collapsed goodput (%.2f)", without.Goodput)
	}
	if without.Goodput >= with.Goodput || without.ByLevel["CRITICAL"] >= with.ByLevel["CRITICAL"] {
		t.Errorf("without triage goodput %.2f (CRITICAL %.2f) against %.2f (%.2f) with it", without.Goodput, without.ByLevel["CRITICAL"], with.Goodput, with.ByLevel["CRITICAL"])
	}
	html, err := os.ReadFile(filepath.Join(dir, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(html), "<svg"); n < 10 || strings.Contains(string(html), "http://") && strings.Contains(string(html), "<script src") {
		t.Errorf("report.html: %d figures, or it loads something from the network", n)
	}
}

// The fault harness end to end, on real processes: by default the hang
// and the retry-storm trigger (TRIAGE_FAULTS=all, or a list, for others),
// each with triage and without. Every run's ledger balances and its tasks
// return to their baseline (the command fails otherwise); result.json has
// a row per run with the fault's window, and report.html shades it. The
// numbers the promise is about are asserted with TRIAGE_MEASURE=1, on a
// machine the harness has to itself (.ci/run runs every fault so).
func TestFaultHarness(t *testing.T) {
	if testing.Short() || raceEnabled || os.Getenv("TRIAGE_MEASURE") != "1" {
		t.Skip("minutes of drills on real processes, with their numbers asserted: TRIAGE_MEASURE=1 TRIAGE_FAULTS=all go test -run TestFaultHarness ./cmd/triage/app (.ci/run runs it so, alone on the machine, without the race detector)")
	}
	faults := os.Getenv("TRIAGE_FAULTS")
	if faults == "" {
		faults = "hang,storm"
	}
	t.Setenv(asCLI, "1")
	dir := t.TempDir()
	var out bytes.Buffer
	args := []string{"demo", "-faults", faults, "-quiet", "-out", dir}
	measure := os.Getenv("TRIAGE_MEASURE") == "1"
	if !measure {
		args = append(args, "-late-ok") // lateness asserted when measuring, as in TestDrillShortened
	}
	code := run(context.Background(), args, &out, &out)
	t.Log(out.String()[max(0, out.Len()-3000):])
	if code != 0 {
		t.Fatalf("triage demo -faults %s exited %d", faults, code)
	}
	var res struct {
		Faults  []drill.FaultRow  `json:"faults"`
		Skipped []string          `json:"skipped"`
		Runs    []drill.RunResult `json:"runs"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "result.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	names := strings.Split(faults, ",")
	if faults == "all" {
		names = drill.Faults()
	}
	if len(res.Faults)+2*len(res.Skipped) != 2*len(names) {
		t.Fatalf("%d fault rows and %d skipped for %d faults", len(res.Faults), len(res.Skipped), len(names))
	}
	for _, s := range res.Skipped {
		t.Logf("skipped: %s", s)
	}
	type roundOf struct {
		fault string
		round int
	}
	without := map[roundOf]drill.FaultRow{}
	for _, r := range res.Faults {
		if w := r.Window[1] - r.Window[0]; w <= 0 || r.Lost+r.Twice != 0 || measure && r.Late != 0 {
			t.Errorf("%s (protection %v): window %v, lost %d, twice %d, late %d", r.Fault, r.Protection, r.Window, r.Lost, r.Twice, r.Late)
		}
		if !r.Protection {
			without[roundOf{r.Fault, r.Round}] = r
		}
	}
	for _, r := range res.Faults {
		if os.Getenv("TRIAGE_MEASURE") != "1" || !r.Protection {
			continue
		}
		// With triage the stack serves the provisioned rate before the
		// fault, and is back to it within the run after the fault is
		// removed (no metastable failure: 16 s). Not asserted for the
		// partition: after it, TCP's retransmission backoff and the DB
		// tasks' quota leases, lost with the link to the quota service,
		// take 7 s to more than 14 s in this drill, with or without
		// triage's other mechanisms; the README reports it.
		if r.GoodputBefore < 0.95 || r.Recovery < 0 && r.Fault != "partition" {
			t.Errorf("with triage, %s: goodput %.2f before, recovered %v s after the fault (-1: not within the run)", r.Fault, r.GoodputBefore, r.Recovery)
		}
		// At twice the provisioned rate, the critical traffic is served
		// through the fault.
		if r.Load > 1 && r.CriticalDuring < 0.99 {
			t.Errorf("with triage at %gx, %s: %.2f%% of CRITICAL_PLUS and CRITICAL answered during the fault", r.Load, r.Fault, 100*r.CriticalDuring)
			logCriticalFailures(t, res.Runs, r)
		}
		// A hung task, or one cut off from the tier below, is noticed and
		// avoided: after the fault's first second, 99% of the critical
		// traffic is served.
		if (r.Fault == "hang" || r.Fault == "partition-one") && r.CriticalLater < 0.99 {
			t.Errorf("with triage, %s: %.2f%% of CRITICAL_PLUS and CRITICAL answered after the fault's first second", r.Fault, 100*r.CriticalLater)
			logCriticalFailures(t, res.Runs, r)
		}
		// After the retry-storm trigger, 99.9% of the critical traffic is
		// served again within 10 s of the DB's return; with
		// TRIAGE_STORM_EVERY_ROUND=1, the goodput is back within a second
		// of the unprotected stack's in the same round too (issue 54's
		// target, in every round, not in the median: unmet, 51 rounds of
		// 53 on 2026-12-04, the two slow ones a DB task's quota refusals,
		// docs/benchmarks.md; CI runs the fault harness without it until
		// it is met).
		if r.Fault == "storm" && (r.RecoveryCritical < 0 || r.RecoveryCritical > 10) {
			t.Errorf("with triage, storm: %v s to 99.9%% of CRITICAL_PLUS and CRITICAL answered (-1: not within the run)", r.RecoveryCritical)
		}
		if w, ok := without[roundOf{r.Fault, r.Round}]; ok && r.Fault == "storm" && os.Getenv("TRIAGE_STORM_EVERY_ROUND") == "1" && (r.Recovery < 0 || r.Recovery > max(w.Recovery, 0)+1) {
			t.Errorf("with triage, storm round %d: recovered in %.2f s, without triage in %.2f s: want within 1 s of it", r.Round, r.Recovery, w.Recovery)
		}
		// A gray failure (a task that hangs or slows) costs less with
		// triage than without.
		if w, ok := without[roundOf{r.Fault, r.Round}]; ok && (r.Fault == "hang" || r.Fault == "slow") && r.GoodputDuring <= w.GoodputDuring {
			t.Errorf("%s: goodput during the fault %.2f with triage, %.2f without", r.Fault, r.GoodputDuring, w.GoodputDuring)
		}
	}
	html, err := os.ReadFile(filepath.Join(dir, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(html), "fill:#DCDCDC"); n != len(res.Faults) {
		t.Errorf("report.html shades %d fault windows, want %d", n, len(res.Faults))
	}
}

// logCriticalFailures logs, for each second of the fault's window, how the
// failed CRITICAL_PLUS and CRITICAL requests ended and what the tiers
// refused, so that a failure in CI says where to look.
func logCriticalFailures(t *testing.T, runs []drill.RunResult, row drill.FaultRow) {
	for i := range runs {
		run := &runs[i]
		if run.Fault != row.Fault || run.Protection != row.Protection || run.Round != row.Round {
			continue
		}
		t.Logf("%s: %v", run.Name, run.Notes)
		for i, s := range run.Seconds {
			if float64(i+1) < row.Window[0] || float64(i) > row.Window[1] || len(s.CriticalRejected) == 0 {
				continue
			}
			t.Logf("second %d: critical failed %v; refused %v; utilization %v", i, s.CriticalRejected, s.Refused, s.Util)
		}
	}
}
