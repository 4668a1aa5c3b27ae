package intake_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/usage"
	"github.com/triagehq/triage/shadow"
	"github.com/triagehq/triage/trust"
)

// waveSignal is a utilization that rises and falls with the fake clock:
// from 0.7 to 1.1 of its target and back every 2 s.
type waveSignal struct{ clk *clock.Fake }

func (waveSignal) Name() string { return "wave" }
func (s waveSignal) Utilization() float64 {
	ms := s.clk.Now().UnixMilli() % 2000
	if ms > 1000 {
		ms = 2000 - ms
	}
	return 0.7 + 0.4*float64(ms)/1000
}

// arrival is one request of the recorded load.
type arrival struct {
	level    criticality.Level
	host     string
	customer string
	expired  bool // its deadline has passed when it arrives
}

// recordedLoad is 3 s of bursts, one every millisecond, of up to 12
// requests: every criticality, a client type the operator black-holed, a
// customer far over its quota, a few requests whose deadline has passed.
func recordedLoad() [][]arrival {
	rng := rand.New(rand.NewPCG(7, 7))
	load := make([][]arrival, 3000)
	for i := range load {
		for range rng.IntN(13) {
			a := arrival{level: criticality.Level(rng.IntN(4)), host: "api.example.com", customer: "search"}
			switch r := rng.IntN(100); {
			case r < 5:
				a.host = "rogue.example.com"
			case r < 25:
				a.customer = "abuser"
			case r < 28:
				a.expired = true
			}
			load[i] = append(load[i], a)
		}
	}
	return load
}

// replay runs the recorded load through an Intake with every server
// mechanism in shadow or none, on virtual time, and returns the
// refusals by mechanism, reason and criticality (enforcing) or the
// would-be refusals (shadow), and how many requests were served.
func replay(t *testing.T, load [][]arrival, inShadow bool) (map[shadow.Key]int64, int) {
	t.Helper()
	clk := clock.NewFake(time.Unix(0, 0))
	rng := rand.New(rand.NewPCG(1, 2))
	ctl, err := admission.New(admission.WithClock(clk), admission.WithRandom(rng.Float64),
		admission.WithSignal(waveSignal{clk}, admission.DefaultThresholds()))
	if err != nil {
		t.Fatal(err)
	}
	policy, err := quota.New(quota.Config{Customers: map[string]quota.Limit{"search": {CPU: 100}, "abuser": {CPU: 0.1}}})
	if err != nil {
		t.Fatal(err)
	}
	table, _ := usage.New(usage.WithClock(clk))
	enf, _ := quota.NewEnforcer(policy, table, quota.WithOverload(func() bool { return true }))
	meter, _ := cost.New(cost.WithClock(clk), cost.WithCPU(func() (time.Duration, error) { return 0, nil })) // no CPU measured: only the recorded usage counts
	iso, _ := isolate.New(isolate.Config{Clients: []isolate.Client{{Name: "rogue", Hosts: []string{"rogue.example.com"}, Route: "black-hole"}}})
	opts := []intake.Option{intake.WithClock(clk), intake.WithAdmission(ctl), intake.WithQuota(enf, meter), intake.WithIsolation(iso),
		intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"10.0.0.0/8"}}))}
	var counts shadow.Counts
	if inShadow {
		opts = append(opts, intake.WithShadow(shadow.All(), &counts))
	}
	in, err := intake.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	refused := map[shadow.Key]int64{}
	served := 0
	for _, burst := range load {
		table.Add("abuser", criticality.Sheddable, 10*time.Millisecond) // ten times its quota, all along
		var admitted []*intake.Handle
		for _, a := range burst {
			ctx := context.Background()
			if a.expired {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, clk.Now())
				defer cancel()
			}
			h, err := in.Accept(ctx, &intake.Request{Peer: trust.Peer{Addr: netip.MustParseAddr("10.0.0.1")}, Host: a.host, Path: "/x",
				Header: map[string][]string{"triage-criticality": {a.level.String()}, "triage-customer": {a.customer}}, Case: intake.LowerCase})
			if err != nil {
				refused[keyOf(t, err, a.level)]++
				continue
			}
			admitted = append(admitted, h)
		}
		for _, h := range admitted {
			if err := h.Start(); err != nil {
				refused[keyOf(t, err, criticality.Of(h))]++
				continue
			}
			served++
			h.Finish()
		}
		clk.Advance(time.Millisecond)
	}
	if inShadow {
		if len(refused) > 0 {
			t.Errorf("shadow refused %v", refused)
		}
		return counts.Snapshot(), served
	}
	return refused, served
}

// keyOf names an enforcing intake's refusal as shadow would.
func keyOf(t *testing.T, err error, l criticality.Level) shadow.Key {
	t.Helper()
	if errors.Is(err, isolate.ErrBlackHoled) {
		return shadow.Key{Mechanism: shadow.Isolation, Reason: "black-hole", Level: l}
	}
	if r, _, ok := admission.RejectionOf(err); ok {
		return shadow.Key{Mechanism: shadow.Admission, Reason: r.String(), Level: l}
	}
	if oe, ok := outcome.As(err); ok && oe.Kind == outcome.OutOfQuota {
		return shadow.Key{Mechanism: shadow.Quota, Reason: "out-of-quota", Level: l}
	}
	t.Fatalf("an unexpected refusal: %v", err)
	return shadow.Key{}
}

// On the same recorded load, on virtual time, an Intake with every
// mechanism in shadow would refuse what an enforcing one refuses, by
// mechanism, reason and criticality, within 3% or 3 requests of each
// count, and serves every request: the mechanisms it shadows see the load
// enforcement would have left them. The tolerance is for the CPU each
// request measures on the real clock (cost.Tracker), charged to its
// customer: a quota decision at the margin can go either way, and the
// draws after it shift (on a good run the counts are equal). On real
// processes the unshed load also changes the delay and CPU the mechanisms
// measure: docs/shadow.md has the drill's comparison.
func TestShadowWouldRefuseWhatEnforcementRefuses(t *testing.T) {
	load := recordedLoad()
	total := 0
	for _, b := range load {
		total += len(b)
	}
	enforced, served := replay(t, load, false)
	wouldRefuse, shadowServed := replay(t, load, true)
	if shadowServed != total {
		t.Errorf("shadow served %d of %d requests", shadowServed, total)
	}
	var sum int64
	for k, n := range enforced {
		sum += n
		if d := abs(wouldRefuse[k] - n); d > max(3, n*3/100) {
			t.Errorf("%v: enforcement refused %d, shadow would have refused %d", k, n, wouldRefuse[k])
		}
	}
	for k, n := range wouldRefuse {
		if _, ok := enforced[k]; !ok {
			t.Errorf("%v: shadow would have refused %d, enforcement none", k, n)
		}
	}
	mechanisms := map[shadow.Mechanism]bool{}
	for k := range enforced {
		mechanisms[k.Mechanism] = true
	}
	if int(sum)+served != total || len(mechanisms) != 3 {
		t.Errorf("enforcement: %d served + %d refused of %d, by %d mechanisms (want admission, quota and isolation)", served, sum, total, len(mechanisms))
	}
	t.Logf("%d requests: enforcement served %d and refused %d (%d kinds of refusal)", total, served, sum, len(enforced))
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}
