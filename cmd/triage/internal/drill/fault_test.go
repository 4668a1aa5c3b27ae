package drill

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/trust"
)

// A class runs at its normal rate at load 1, its peak at peakLoad, and in
// proportion between: at 2x, the stack gets twice the provisioned rate,
// the excess as the surge's traffic.
func TestClassRate(t *testing.T) {
	total := func(load float64) (sum, critical float64) {
		for _, c := range classes {
			sum += c.rate(load)
			if c.level >= 2 {
				critical += c.rate(load)
			}
		}
		return sum, critical
	}
	for _, tc := range []struct{ load, want float64 }{{1, ProvisionedRate}, {2, 2 * ProvisionedRate}, {peakLoad, peakLoad * ProvisionedRate}} {
		if got, crit := total(tc.load); got < tc.want-1e-9 || got > tc.want+1e-9 || crit != 50 {
			t.Errorf("load %v: %v requests/s (%v critical), want %v (50 critical)", tc.load, got, crit, tc.want)
		}
	}
}

// Fault names: all, or the harness's own; anything else is refused with
// the list.
func TestFaultScenarios(t *testing.T) {
	all, err := faultScenarios([]string{"all"})
	if err != nil || len(all) != len(faults) {
		t.Fatalf("all: %d scenarios, %v", len(all), err)
	}
	two, err := faultScenarios([]string{"storm", " hang"})
	if err != nil || len(two) != 2 || two[0].fault.name != "hang" || two[1].fault.name != "storm" {
		t.Fatalf("hang and storm: %v", err)
	}
	for _, p := range two[0].phases {
		if p.dur <= 0 || p.load != 1 {
			t.Errorf("phase %+v", p)
		}
	}
	if _, err := faultScenarios([]string{"meteor"}); err == nil || !strings.Contains(err.Error(), "crash, hang, slow") {
		t.Errorf("an unknown fault: %v", err)
	}
}

// A fault run's row: goodput before, during and after, critical answered
// during and after, and the recovery: from the fault's removal to the
// first of three seconds in a row at 0.95 or more.
func TestFaultRow(t *testing.T) {
	r := newRun("hang, with triage", true, nil)
	r.Fault = "hang"
	ok := func(n int) Second {
		return Second{Sent: [4]int{25, 25, 40, 10}, OK: [4]int{min(n, 25), min(max(n-25, 0), 25), min(max(n-50, 0), 40), min(max(n-90, 0), 10)}}
	}
	// 0-1 before; 2-4 the fault; 5-11 after, recovered from 7 (8 dips).
	for _, n := range []int{100, 100, 60, 50, 70, 80, 90, 100, 100, 100, 100, 100} {
		r.Seconds = append(r.Seconds, ok(n))
	}
	r.Seconds[8] = ok(94) // a dip below 0.95 after recovering: the first three in a row count
	// Second 9 answers all but one CRITICAL request: goodput 0.99, but
	// not 99.9% of CRITICAL*; 10-13 answer everything.
	r.Seconds[9] = Second{Sent: [4]int{25, 25, 40, 10}, OK: [4]int{25, 25, 39, 10}}
	r.Seconds = append(r.Seconds, ok(100), ok(100))
	r.phaseAt("before", 0)
	r.phaseAt("fault", 2*time.Second)
	r.phaseAt("after", 5*time.Second)
	r.faultWindow(2.1, 5.2)
	r.Ledger.Sent, r.Ledger.Answered = [4]uint64{10, 10, 10, 10}, [4]uint64{10, 9, 10, 10}
	r.finish(14 * time.Second)
	row := r.faultRow()
	if row.Recovery < 3.8-1e-9 || row.Recovery > 3.8+1e-9 {
		t.Errorf("recovery %v s, want %v (seconds 9-11 are the first three in a row at 0.95)", row.Recovery, 9-5.2)
	}
	if row.RecoveryCritical < 4.8-1e-9 || row.RecoveryCritical > 4.8+1e-9 {
		t.Errorf("recovery of CRITICAL* %v s, want %v (seconds 10-12 are the first three in a row at 99.9%%)", row.RecoveryCritical, 10-5.2)
	}
	if row.GoodputBefore != 1 || row.GoodputDuring < 0.6-1e-9 || row.GoodputDuring > 0.6+1e-9 || row.Lost != 1 || row.Load != 1 {
		t.Errorf("row %+v", row)
	}
	// Critical: second 2 answers 10 of 50 critical (60 OK: 25+25+10),
	// 3 none, 4 20: 30 of 150.
	if row.CriticalDuring != 30.0/150 {
		t.Errorf("critical during %v, want %v", row.CriticalDuring, 30.0/150)
	}
	if row.CriticalLater != 20.0/100 { // seconds 3 and 4
		t.Errorf("critical during the fault after its first second %v, want %v", row.CriticalLater, 20.0/100)
	}
	never := newRun("x", true, nil)
	never.Fault = "storm"
	never.Seconds = []Second{ok(100), ok(10), ok(10), ok(10)}
	never.phaseAt("before", 0)
	never.phaseAt("fault", time.Second)
	never.phaseAt("after", 2*time.Second)
	never.faultWindow(1, 2)
	never.finish(4 * time.Second)
	if row := never.faultRow(); row.Recovery != -1 || row.RecoveryCritical != -1 {
		t.Errorf("a stack that never recovered: recovery %v, of CRITICAL* %v", row.Recovery, row.RecoveryCritical)
	}
	meds := faultMedians([]FaultRow{{Fault: "a", Protection: true, GoodputAfter: 1, Recovery: -1, RecoveryCritical: 1, Lost: 1},
		{Fault: "a", Protection: true, GoodputAfter: 0.5, Recovery: 2, RecoveryCritical: -1}, {Fault: "a", Protection: true, GoodputAfter: 0.8, Recovery: -1, RecoveryCritical: 3}})
	if len(meds) != 1 || meds[0].GoodputAfter != 0.8 || meds[0].Recovery != -1 || meds[0].RecoveryCritical != 3 || meds[0].Rounds != 3 || meds[0].Lost != 1 {
		t.Errorf("medians %+v", meds)
	}
	res := &Result{Runs: []*RunResult{r}, Faults: faultRows([]*RunResult{r})}
	if s := res.Summary(); !strings.Contains(s, "hang") || !strings.Contains(s, "4 s") || !strings.Contains(s, "1/0/0") {
		t.Errorf("summary:\n%s", s)
	}
	html, err := res.Report()
	if err != nil || !strings.Contains(string(html), "fault harness") || !strings.Contains(string(html), "fill:#DCDCDC") {
		t.Errorf("report: %v, or without the harness's heading or the fault's shaded window", err)
	}
}

// The slow knob: bad input is refused, a good request slows the handlers
// for its time, and slow=1 restores them.
func TestSlowKnob(t *testing.T) {
	tk := &task{cfg: Task{ID: "db-0"}}
	post := func(q string) int {
		w := httptest.NewRecorder()
		tk.serveFault(w, httptest.NewRequest(http.MethodPost, "/fault?"+q, nil))
		return w.Code
	}
	for _, q := range []string{"", "slow=0&for=1s", "slow=101&for=1s", "slow=x&for=1s", "slow=10", "slow=10&for=0s", "slow=10&for=6m", "slow=10&for=soon"} {
		if code := post(q); code != http.StatusBadRequest {
			t.Errorf("%q: %d", q, code)
		}
	}
	if tk.slowdown() != 1 {
		t.Fatal("slowed by bad input")
	}
	if code := post("slow=10&for=1m"); code != http.StatusOK || tk.slowdown() != 10 {
		t.Fatalf("slow=10: %d, slowdown %d", code, tk.slowdown())
	}
	if code := post("slow=1&for=1s"); code != http.StatusOK || tk.slowdown() != 1 {
		t.Fatalf("slow=1: %d, slowdown %d", code, tk.slowdown())
	}
}

// A DB task in the partition faults' namespace sees tier B at the host's
// end of the veth pair, 10.201.N.1: it must trust it as it trusts
// loopback, or every request reaches it without its customer (quota's
// "(other)", over its limit whenever the DB sheds).
func TestTasksTrustThePartitionsHostSide(t *testing.T) {
	tr := taskTrust()
	for _, a := range []string{"127.0.0.1", "10.201.0.1", "10.201.249.1"} {
		if !tr.Trusted(trust.Peer{Addr: netip.MustParseAddr(a)}) {
			t.Errorf("%s not trusted", a)
		}
	}
	if tr.Trusted(trust.Peer{Addr: netip.MustParseAddr("10.202.0.1")}) {
		t.Error("an address outside the drill's trusted")
	}
}
