package drill

import (
	"testing"
	"time"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/clock"
)

// A machine's slot time, the "CPU" its quotas charge, is every slot-second
// its requests held, whoever else read the machine in between (the load
// reports' utilization reads move the same clock).
func TestMachineSlotTimeCountsEverySlotSecond(t *testing.T) {
	now := time.Unix(1000, 0)
	m := newMachine(2, time.Second)
	m.now = func() time.Time { return now }
	m.lastAt, m.lastRead = now, now
	a := m.begin(time.Second)
	now = now.Add(100 * time.Millisecond) // one slot busy
	b := m.begin(time.Second)
	now = now.Add(100 * time.Millisecond) // two
	m.utilization()
	now = now.Add(100 * time.Millisecond) // two
	got, err := m.slotTime()
	if err != nil || got != 500*time.Millisecond {
		t.Fatalf("slot time %v (%v), want 500ms: 0.1 s of one slot and 0.2 s of two", got, err)
	}
	m.end(a)
	m.end(b)
	now = now.Add(time.Second) // idle
	if got, _ := m.slotTime(); got != 500*time.Millisecond {
		t.Fatalf("an idle second added to the slot time: %v", got)
	}
}

// A task whose callers stopped for a while (the storm's tier above it
// frozen) and then came back reports, with its first answers after, a
// capability (rate per unit of utilization) near the one before: its
// rate and its utilization cover the same window. A utilization over a
// shorter interval than the rate's reads near 0 after the idle moment,
// and the balancers above send it all their traffic.
func TestMachineReportAfterIdleKeepsItsCapability(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	m := newMachine(2, 10*time.Millisecond)
	m.now = clk.Now
	m.lastAt, m.lastRead = clk.Now(), clk.Now()
	meter, err := m.meter(clk)
	if err != nil {
		t.Fatal(err)
	}
	serve := func(d time.Duration) balance.Load { // one slot busy half the time
		var l balance.Load
		for end := clk.Now().Add(d); clk.Now().Before(end); {
			f := m.begin(10 * time.Millisecond)
			clk.Advance(10 * time.Millisecond)
			m.end(f)
			meter.Record(false)
			l = meter.Load()
			clk.Advance(10 * time.Millisecond)
		}
		return l
	}
	before := serve(20 * time.Second)
	clk.Advance(5 * time.Second) // the callers stopped
	after := serve(20 * time.Millisecond)
	capa := func(l balance.Load) float64 { return l.QPS / l.Utilization }
	if r := capa(after) / capa(before); !(r > 0.5 && r < 2) {
		t.Fatalf("capability %.0f/s before the idle 5 s (%+v), %.0f/s at the first answer after (%+v): %.1fx", capa(before), before, capa(after), after, r)
	}
}
