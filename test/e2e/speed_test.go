package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/usage"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// speedBackendEnv starts TestSpeedBackendProcess: "listen-addr,speed,work-multiple".
const speedBackendEnv = "TRIAGE_E2E_SPEED_BACKEND"

// speedLimit is the customer's hard limit in normalised CPU-seconds per
// second, speedWork a request's CPU on the reference machine.
const (
	speedLimit = 0.15
	speedWork  = 10 * time.Millisecond
)

// TestSpeedBackendProcess is one task of TestNormalisedQuotaOnTwoMachineSpeeds,
// in a process of its own so that its CPU is its requests' alone: each
// request does speedWork x work-multiple of CPU; the task's costs are
// normalised by cost.WithSpeed(speed); customer "c" has a hard limit of
// speedLimit.
func TestSpeedBackendProcess(t *testing.T) {
	env := os.Getenv(speedBackendEnv)
	if env == "" {
		t.Skip("TestNormalisedQuotaOnTwoMachineSpeeds runs this as a separate process")
	}
	parts := strings.Split(env, ",")
	speed, _ := strconv.ParseFloat(parts[1], 64)
	mult, _ := strconv.ParseFloat(parts[2], 64)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	rounds := calibrate(time.Duration(mult * float64(speedWork)))
	p, err := quota.New(quota.Config{Default: quota.Limit{CPU: 100}, Customers: map[string]quota.Limit{"c": {CPU: speedLimit, Hard: true}}})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := usage.New()
	e, err := quota.NewEnforcer(p, u)
	if err != nil {
		t.Fatal(err)
	}
	m, err := cost.New(cost.WithSpeed(speed))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})), intake.WithQuota(e, m)))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(srv.ServerOptions()...)
	relay.Register(gs, &relay.Tier{Name: "task", Fail: func(context.Context, string) error {
		work(rounds)
		return nil
	}})
	lis, err := loopback.ListenRetry(parts[0])
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	fmt.Println("ready")
	<-ctx.Done()
	gs.Stop()
}

// A quota written in normalised CPU holds the same work on machines of
// two speeds (issue 23, item 5): a task on the reference machine, whose
// requests take 10 ms of CPU, and one on a machine half as fast
// (cost.WithSpeed(0.5)), whose identical requests take 20 ms, each enforce
// a hard limit of 0.15 normalised CPU-seconds per second for one customer
// under load: both serve about 15 requests a second (0.15 / 10 ms, less
// what the process spends outside its handlers, which package cost
// charges to the requests), of about 30 offered (two callers, each a request every 50 ms).
// The slow machine without its speed serves half that. (The emulated slow
// machine is slow in its handlers only: its gRPC work is as fast as the
// reference's, so small requests would favour it.) Each task is a
// process of its own, run one after the other (its CPU is its requests'
// and its refusals'). A measurement: TRIAGE_MEASURE=1.
func TestNormalisedQuotaOnTwoMachineSpeeds(t *testing.T) {
	if !measuring() {
		t.Skip("a measurement: TRIAGE_MEASURE=1")
	}
	client := loopback.Client(t, egress.WithoutPolicy())
	run := func(speed, mult float64) float64 {
		addr := loopback.FreeAddr(t)
		cmd := exec.Command(os.Args[0], "-test.run=^TestSpeedBackendProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%g,%g", speedBackendEnv, addr, speed, mult))
		p := startChild(t, "task", cmd, "ready")
		<-p.ready
		defer func() {
			p.cmd.Process.Signal(syscall.SIGTERM)
			p.cmd.Wait()
		}()
		cc, err := grpc.NewClient(addr, append(client.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		var (
			mu     sync.Mutex
			served int
			wg     sync.WaitGroup
		)
		start := time.Now()
		from, end := start.Add(4*time.Second), start.Add(12*time.Second)
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 20000 && time.Now().Before(end); i++ {
					ctx, cancel := context.WithTimeout(quota.NewContext(context.Background(), "c"), time.Second)
					_, err := relay.Invoke(ctx, cc, "x")
					cancel()
					if err == nil && time.Now().After(from) {
						mu.Lock()
						served++
						mu.Unlock()
					}
					time.Sleep(time.Second / 20) // twice the quota's rate in all
				}
			}()
		}
		wg.Wait()
		return float64(served) / end.Sub(from).Seconds()
	}
	want := speedLimit / speedWork.Seconds()
	ref := run(1, 1)
	slow := run(0.5, 2)
	plain := run(1, 2) // the slow machine without its speed
	t.Logf("requests served a second under a quota of %.2f normalised CPU-s/s (%.0f/s of reference work): reference machine %.1f, half-speed machine %.1f; the half-speed machine without WithSpeed %.1f",
		speedLimit, want, ref, slow, plain)
	for name, got := range map[string]float64{"reference": ref, "half-speed": slow} {
		if got < 0.85*want || got > 1.15*want {
			t.Errorf("%s machine served %.1f/s, want %.1f within 15%%", name, got, want)
		}
	}
}
