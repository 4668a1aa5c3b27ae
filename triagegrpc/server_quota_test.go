package triagegrpc_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/usage"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// spin burns about d of CPU.
func spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// A backend with quotas over loopback: a customer past its hard limit is
// refused out of quota with a retry-after, another is not; each request's
// CPU is charged to its customer, and a handler's outgoing call is a wait,
// not CPU: a customer whose requests mostly wait on a downstream is
// charged far less than one whose requests compute.
func TestServerQuotaOverLoopback(t *testing.T) {
	down := grpc.NewServer()
	relay.Register(down, &relay.Tier{Name: "down", Fail: func(context.Context, string) error {
		time.Sleep(20 * time.Millisecond)
		return nil
	}})
	client := loopback.Client(t, egress.WithoutPolicy())
	downCC := loopback.DialGRPC(t, loopback.ServeGRPC(t, down), client.DialOptions()...)

	p, err := quota.New(quota.Config{Default: quota.Limit{CPU: 100}, Customers: map[string]quota.Limit{"capped": {CPU: 0.05, Hard: true}}})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := usage.New()
	e, err := quota.NewEnforcer(p, u)
	if err != nil {
		t.Fatal(err)
	}
	m, err := cost.New()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})), intake.WithQuota(e, m)))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(srv.ServerOptions()...)
	relay.Register(gs, &relay.Tier{Name: "backend", Fail: func(ctx context.Context, body string) error {
		if body == "wait" {
			_, err := relay.Invoke(ctx, downCC, body)
			return err
		}
		spin(2 * time.Millisecond)
		return nil
	}})
	cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, gs), client.DialOptions()...)

	var (
		mu      sync.Mutex
		refused = map[string]int{}
		wg      sync.WaitGroup
		// largest is the most CPU one capped request was charged, in
		// CPU-seconds per second of the window: the capped customer's
		// requests run one at a time and are charged before their reply,
		// so each call's charge is the change in its usage across it.
		largest float64
	)
	deadline := time.Now().Add(3 * time.Second)
	for _, w := range []struct{ customer, body string }{{"capped", "burn"}, {"burner", "burn"}, {"waiter", "wait"}, {"waiter", "wait"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000 && time.Now().Before(deadline); i++ {
				ctx, cancel := context.WithTimeout(quota.NewContext(context.Background(), w.customer), time.Second)
				before := u.Total(w.customer)
				_, err := relay.Invoke(ctx, cc, w.body)
				cancel()
				if err == nil {
					if w.customer == "capped" {
						largest = max(largest, u.Total(w.customer)-before)
					}
					continue
				}
				var oe *outcome.Error
				if !errors.As(err, &oe) || oe.Kind != outcome.OutOfQuota || oe.RetryAfter != time.Second || status.Code(err) != codes.ResourceExhausted {
					t.Errorf("%s: %v", w.customer, err)
					return
				}
				mu.Lock()
				refused[w.customer]++
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	snap := map[string]usage.Customer{}
	for _, c := range u.Snapshot() {
		snap[c.Customer] = c
	}
	t.Logf("refused %v; usage capped %.4f (largest request %.1f ms), burner %.3f, waiter %.3f CPU-s/s",
		refused, u.Total("capped"), largest*u.Window().Seconds()*1e3, u.Total("burner"), u.Total("waiter"))
	if refused["capped"] == 0 || refused["burner"] != 0 || refused["waiter"] != 0 {
		t.Errorf("refused %v: want only the capped customer", refused)
	}
	// Never over the hard limit over the 4 s window, but for the one
	// request in flight when it got there. That request spins about 2 ms,
	// but what it is charged depends on how the machine shares its CPUs
	// (package cost), so the allowance is the largest charge measured.
	if got := u.Total("capped"); got > 0.05+largest {
		t.Errorf("hard limit 0.05: capped used %.4f, over by more than its largest request (%.4f)", got, largest)
	}
	if snap["capped"].Refused == 0 || snap["capped"].Demand <= u.Total("capped") {
		t.Errorf("capped snapshot %+v: refusals not counted in its demand", snap["capped"])
	}
	if b, w := u.Total("burner"), u.Total("waiter"); b <= 0 || w > 0.25*b {
		t.Errorf("burner charged %.3f, waiter %.3f: the downstream waits were charged as CPU", b, w)
	}
	if _, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithQuota(e, nil))); err == nil {
		t.Error("WithQuota without a cost meter accepted")
	}
}
