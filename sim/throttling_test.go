package sim

import (
	"testing"
)

func TestThrottlingPessimisticNeverExceedsTheLimit(t *testing.T) {
	r, err := Throttling(ThrottlingConfig{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range r.Table {
		t.Log(row)
	}
	if v := headlineValue(t, r, "1 s windows over the limit, pessimistic"); v != 0 {
		t.Errorf("pessimistic: %v windows over the limit, want 0", v)
	}
	if v := headlineValue(t, r, "peak sliding 1 s usage / limit, pessimistic"); v > 1 {
		t.Errorf("pessimistic: a sliding 1 s window used %.3f of the limit", v)
	}
	if v := headlineValue(t, r, "peak 1 s usage / limit, optimistic"); v <= 1.05 {
		t.Errorf("optimistic: peak %.3f of the limit, want a brief overshoot", v)
	}
}
