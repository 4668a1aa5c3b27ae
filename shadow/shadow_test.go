package shadow_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/shadow"
)

// Log writes at most one line per mechanism per interval, with every
// would-be refusal since the mechanism's last line; Flush writes the
// rest; unknown reasons are not counted.
func TestLogIsSampled(t *testing.T) {
	clk := clock.NewFake(time.Unix(100, 0))
	var buf bytes.Buffer
	lg := shadow.NewLog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}})), time.Second, clk)
	for range 1000 {
		lg.WouldRefuse(shadow.Admission, "concurrency", criticality.Sheddable)
		lg.WouldRefuse(shadow.Quota, "out-of-quota", criticality.Critical)
		lg.WouldRefuse(shadow.Quota, "not-a-reason", criticality.Critical)
		clk.Advance(time.Millisecond)
	}
	lg.Flush()
	got := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		`level=INFO msg="shadow: would have refused" mechanism=admission concurrency.SHEDDABLE=1`,
		`level=INFO msg="shadow: would have refused" mechanism=quota out-of-quota.CRITICAL=1`,
		`level=INFO msg="shadow: would have refused" mechanism=admission concurrency.SHEDDABLE=999`,
		`level=INFO msg="shadow: would have refused" mechanism=quota out-of-quota.CRITICAL=999`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Counts counts by mechanism, reason and criticality, and only what the
// mechanisms can give; Set names the mechanisms in shadow.
func TestCountsAndSets(t *testing.T) {
	var c shadow.Counts
	var o shadow.Observer = shadow.Tee(&c, nil, shadow.Nop{})
	o.WouldRefuse(shadow.Throttle, "throttled", criticality.SheddablePlus)
	o.WouldRefuse(shadow.Throttle, "throttled", criticality.SheddablePlus)
	o.WouldRefuse(shadow.Throttle, "made-up", criticality.SheddablePlus)
	o.WouldRefuse(shadow.NumMechanisms, "throttled", criticality.SheddablePlus)
	got := c.Snapshot()
	if len(got) != 1 || got[shadow.Key{Mechanism: shadow.Throttle, Reason: "throttled", Level: criticality.SheddablePlus}] != 2 {
		t.Errorf("counts %v", got)
	}
	s := shadow.Of(shadow.Quota, shadow.Throttle)
	if !s.Has(shadow.Quota) || !s.Has(shadow.Throttle) || s.Has(shadow.Admission) || (shadow.Set(0)).Has(shadow.Quota) {
		t.Errorf("Set %b", s)
	}
	for m := range shadow.NumMechanisms {
		if !shadow.All().Has(m) || m.String() == "unknown" || len(shadow.Reasons[m]) == 0 {
			t.Errorf("mechanism %d: in All %v, name %q, reasons %v", m, shadow.All().Has(m), m, shadow.Reasons[m])
		}
	}
}
