package quota

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota/usage"
)

func TestParseMode(t *testing.T) {
	for _, m := range []Mode{ModeOptimistic, ModePessimistic} {
		got, err := ParseMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	for _, s := range []string{"", "Pessimistic", "safe", "optimistic "} {
		if _, err := ParseMode(s); err == nil {
			t.Errorf("ParseMode(%q) accepted", s)
		}
	}
	if _, err := NewEnforcer(&Policy{}, mustUsage(t), WithMode(Mode(7))); err == nil {
		t.Error("NewEnforcer accepted mode 7")
	}
	for _, h := range []float64{-0.1, 0.95, nanF()} {
		if _, err := NewEnforcer(&Policy{}, mustUsage(t), WithHeadroom(h)); err == nil {
			t.Errorf("NewEnforcer accepted headroom %v", h)
		}
	}
}

func nanF() float64 { var z float64; return z / z }

func mustUsage(t *testing.T) *usage.Table {
	t.Helper()
	u, err := usage.New()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// A pessimistic Enforcer never serves more than its limit in any 1 s
// window, even when demand arrives all at once at 20x the limit; an
// optimistic one overshoots at the onset.
func TestPessimisticHoldsTheLimitAheadOfUsage(t *testing.T) {
	for _, mode := range []Mode{ModeOptimistic, ModePessimistic} {
		clk := clock.NewFake(time.Unix(0, 0))
		p, err := New(Config{Customers: map[string]Limit{"a": {CPU: 0.5, Hard: true}}})
		if err != nil {
			t.Fatal(err)
		}
		u, _ := usage.New(usage.WithClock(clk))
		e, err := NewEnforcer(p, u, WithMode(mode))
		if err != nil {
			t.Fatal(err)
		}
		if e.Mode() != mode {
			t.Fatalf("Mode() = %v, want %v", e.Mode(), mode)
		}
		// 10 CPU-s/s of 2 ms requests for 5 s; per 10 ms bucket, the CPU served.
		var served [500]float64
		for i := range served {
			for range 50 {
				r, err := e.Reserve("a", criticality.Sheddable)
				if err != nil {
					continue
				}
				e.Done("a", criticality.Sheddable, r, 2*time.Millisecond)
				served[i] += 0.002
			}
			clk.Advance(10 * time.Millisecond)
		}
		peak := 0.0
		for i := 0; i+100 <= len(served); i++ {
			s := 0.0
			for _, v := range served[i : i+100] {
				s += v
			}
			peak = max(peak, s)
		}
		t.Logf("%v: peak sliding 1 s = %.3f CPU-s against a limit of 0.5", mode, peak)
		switch mode {
		case ModePessimistic:
			if peak > 0.5 {
				t.Errorf("pessimistic: %.3f CPU-s in a 1 s window, limit 0.5", peak)
			}
			if peak < 0.5*(1-DefaultHeadroom)*0.95 {
				t.Errorf("pessimistic: only %.3f CPU-s in the best 1 s window: the budget is not filling", peak)
			}
		case ModeOptimistic:
			if peak <= 0.5 {
				t.Errorf("optimistic: peak %.3f; expected the measured limit to overshoot at the onset", peak)
			}
		}
	}
}

// Cancel gives the reservation back; a request whose real cost exceeds
// what it reserved is charged the difference.
func TestPessimisticSettlesAndCancels(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	p, _ := New(Config{Customers: map[string]Limit{"a": {CPU: 1, Hard: true}}})
	u, _ := usage.New(usage.WithClock(clk))
	e, err := NewEnforcer(p, u, WithMode(ModePessimistic), WithHeadroom(0))
	if err != nil {
		t.Fatal(err)
	}
	r0, err := e.Reserve("a", criticality.Critical) // a new budget starts empty
	if err != nil {
		t.Fatal(err)
	}
	e.Cancel("a", r0)
	clk.Advance(time.Second) // the budget fills to its cap: 50 ms
	admitted := func() int {
		n := 0
		for {
			r, err := e.Reserve("a", criticality.Critical)
			if err != nil {
				var want = e.errOut
				if !errors.Is(err, want) && err != want {
					t.Fatalf("refusal %v", err)
				}
				return n
			}
			if r.cpu != initialCost.Seconds() {
				t.Fatalf("reserved %v, want the initial guess %v", r.cpu, initialCost.Seconds())
			}
			e.Cancel("a", r)
			n++
			if n > 1000 {
				return n
			}
		}
	}
	if n := admitted(); n <= 1000 {
		t.Fatalf("with every reservation cancelled, only %d admitted", n)
	}
	// One request reserves 1 ms but costs 80 ms: the budget is 30 ms in
	// debt and refuses until it has filled back for 30 ms.
	r, err := e.Reserve("a", criticality.Critical)
	if err != nil {
		t.Fatal(err)
	}
	e.Done("a", criticality.Critical, r, 80*time.Millisecond)
	if _, err := e.Reserve("a", criticality.Critical); err == nil {
		t.Fatal("admitted while the budget is in debt")
	}
	clk.Advance(29 * time.Millisecond)
	if _, err := e.Reserve("a", criticality.Critical); err == nil {
		t.Fatal("admitted after 29 ms of a 30 ms debt")
	}
	clk.Advance(2 * time.Millisecond)
	if _, err := e.Reserve("a", criticality.Critical); err != nil {
		t.Fatalf("refused once the debt is paid: %v", err)
	}
}

// The budgets are bounded like the Usage: customers beyond MaxTracked
// share the Other budget.
func TestPessimisticBudgetsBounded(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	p, _ := New(Config{Default: Limit{CPU: 1, Hard: true}})
	u, _ := usage.New(usage.WithClock(clk), usage.WithMaxTracked(10))
	e, _ := NewEnforcer(p, u, WithMode(ModePessimistic))
	clk.Advance(time.Second)
	for i := range 1000 {
		name := "c" + string(rune('a'+i%26)) + string(rune('a'+i/26%26))
		if r, err := e.Reserve(name, criticality.Critical); err == nil {
			e.Done(name, criticality.Critical, r, time.Microsecond)
		}
	}
	if n := len(e.budgets.byName); n > 11 {
		t.Fatalf("%d budgets, bound 10 + Other", n)
	}
}

// Pessimistic budgets at their bound: once the tracked customers have
// been idle for budgetIdle, a new customer gets a budget of its own
// instead of Other's for good.
func TestBudgetsEvictIdleCustomers(t *testing.T) {
	b := &budgets{max: 100, burst: DefaultBurst.Seconds(), byName: map[string]*budget{}}
	now := int64(0)
	for i := range 100 {
		b.get(fmt.Sprintf("c%d", i), now)
	}
	if b.get("late", now) != b.byName[Other] {
		t.Fatal("a customer past the bound did not share Other's budget")
	}
	now += int64(budgetIdle + time.Second)
	b.get("c0", now).at = now // one customer still active
	if bg := b.get("newcomer", now); bg == b.byName[Other] || b.byName["newcomer"] != bg {
		t.Error("after the others went idle, a new customer still shares Other's budget")
	}
	if b.byName["c0"] == nil || len(b.byName) > 100 {
		t.Errorf("%d budgets; the active one kept: %v", len(b.byName), b.byName["c0"] != nil)
	}
}
