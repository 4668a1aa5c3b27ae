package quota

import (
	"math"
	"strings"
	"testing"

	"github.com/triagehq/triage/criticality"
)

// The book's proportions (4000/4000/3000/500 CPUs of a 10,000-CPU service,
// an oversubscribed total), scaled down.
func bookPolicy(t *testing.T) *Policy {
	t.Helper()
	p, err := New(Config{
		Default: Limit{CPU: 0.1},
		Tasks:   3,
		Customers: map[string]Limit{
			"gmail":    {CPU: 4},
			"calendar": {CPU: 4, ByCriticality: map[string]float64{"SHEDDABLE": 1}},
			"android":  {CPU: 3},
			"batch":    {CPU: 0.5, Hard: true},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPolicyLimits(t *testing.T) {
	p := bookPolicy(t)
	for _, tc := range []struct {
		customer string
		level    criticality.Level
		cpu      float64
		hard     bool
	}{
		{"gmail", criticality.Critical, 4, false},
		{"calendar", criticality.CriticalPlus, 4, false},
		{"calendar", criticality.Sheddable, 1, false},
		{"batch", criticality.Sheddable, 0.5, true},
		{"unknown-customer", criticality.Critical, 0.1, false},
	} {
		cpu, hard := p.Limit(tc.customer, tc.level)
		if cpu != tc.cpu || hard != tc.hard {
			t.Errorf("%s/%v: limit %v hard %v, want %v %v", tc.customer, tc.level, cpu, hard, tc.cpu, tc.hard)
		}
	}
	if p.Fallback() != Safe || p.fallbackLimit("gmail", criticality.Critical) != 4.0/3 {
		t.Errorf("safe fallback: %v %v", p.Fallback(), p.fallbackLimit("gmail", criticality.Critical))
	}
	if !p.Known("android") || p.Known("unknown-customer") || strings.Join(p.Customers(), ",") != "android,batch,calendar,gmail" {
		t.Errorf("customers %v", p.Customers())
	}
	opt, _ := New(Config{Fallback: Optimistic, Default: Limit{CPU: 1}})
	pes, _ := New(Config{Fallback: Pessimistic, Default: Limit{CPU: 1}})
	if !math.IsInf(opt.fallbackLimit("x", criticality.Critical), 1) || pes.fallbackLimit("x", criticality.Critical) != 0 {
		t.Error("optimistic and pessimistic fallbacks")
	}
}

// A malformed or hostile policy is refused as a whole, with every problem
// named.
func TestPolicyRefusesBadInput(t *testing.T) {
	for name, tc := range map[string]struct {
		c    Config
		want string
	}{
		"NaN":                 {Config{Default: Limit{CPU: math.NaN()}}, "default: cpu is not a number"},
		"infinite":            {Config{Default: Limit{CPU: math.Inf(1)}}, "is not a number"},
		"negative":            {Config{Customers: map[string]Limit{"a": {CPU: -1}}}, "customer a: cpu is negative"},
		"huge":                {Config{Customers: map[string]Limit{"a": {CPU: 1e300}}}, "is above"},
		"blank name":          {Config{Customers: map[string]Limit{"  ": {CPU: 1}}}, "blank name"},
		"odd name":            {Config{Customers: map[string]Limit{"a\nb": {CPU: 1}}}, "not allowed"},
		"long name":           {Config{Customers: map[string]Limit{strings.Repeat("a", 129): {CPU: 1}}}, "longer than"},
		"unknown level":       {Config{Customers: map[string]Limit{"a": {CPU: 1, ByCriticality: map[string]float64{"HIGH": 1}}}}, `criticality "HIGH" is not a level`},
		"level above total":   {Config{Customers: map[string]Limit{"a": {CPU: 1, ByCriticality: map[string]float64{"CRITICAL": 2}}}}, "above the customer's"},
		"level NaN":           {Config{Customers: map[string]Limit{"a": {CPU: 1, ByCriticality: map[string]float64{"CRITICAL": math.NaN()}}}}, "is not a number"},
		"unknown fallback":    {Config{Fallback: "closed"}, "fallback"},
		"negative tasks":      {Config{Tasks: -2}, "tasks -2"},
		"several at once, 10": {Config{Default: Limit{CPU: -1}, Tasks: -1, Fallback: "x"}, "fallback"},
	} {
		_, err := New(tc.c)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "quota: invalid policy: ") {
			t.Errorf("%s: err %v, want one containing %q", name, err, tc.want)
		}
	}
}
