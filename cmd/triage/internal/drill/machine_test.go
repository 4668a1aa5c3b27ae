package drill

import (
	"testing"
	"time"
)

// A machine's slot time, the "CPU" its quotas charge, is every slot-second
// its requests held, whoever else read the machine in between (the load
// reports' utilization reads move the same clock).
func TestMachineSlotTimeCountsEverySlotSecond(t *testing.T) {
	now := time.Unix(1000, 0)
	m := newMachine(2, time.Second)
	m.now = func() time.Time { return now }
	m.lastAt, m.lastRead, m.ewmaAt = now, now, now
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
