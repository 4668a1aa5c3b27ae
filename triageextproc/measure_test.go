package triageextproc_test

import (
	"context"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triageextproc"
	"github.com/triagehq/triage/trust"
)

// The processor's decision time (request headers sent to its answer)
// under overload, against Envoy's message_timeout: 64 streams at a time,
// each request holding its slot 20 ms (the upstream's time) once
// admitted, a mix of criticalities, CRITICAL ones with 10 s deadlines,
// for 3 s. The bound is the processor's DecisionTimeout (the
// documented -max-wait, 150 ms); every decision must come before it
// plus a scheduling margin, well before message_timeout (200 ms).
// TRIAGE_MEASURE=1 go test -run TestDecisionTimesUnderLoad -v ./triageextproc
func TestDecisionTimesUnderLoad(t *testing.T) {
	if os.Getenv("TRIAGE_MEASURE") != "1" {
		t.Skip("a measurement: TRIAGE_MEASURE=1")
	}
	ctl, err := admission.New(admission.WithMaxWait(150*time.Millisecond), admission.WithLimits(2, 4, 64))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := triageextproc.New(intake.WithAdmission(ctl), intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})))
	if err != nil {
		t.Fatal(err)
	}
	srv.DecisionTimeout = 150 * time.Millisecond
	env, _ := envoyFor(t, srv, "127.0.0.1:50000", nil)
	cc := env.cc
	levels := []string{"CRITICAL_PLUS", "CRITICAL", "SHEDDABLE_PLUS", "SHEDDABLE"}
	var mu sync.Mutex
	var times []time.Duration
	refused := 0
	end := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(end); i++ {
				h := http.Header{"Triage-Criticality": {levels[(w+i)%4]}, "Content-Type": {"application/grpc"}, "Grpc-Timeout": {"10S"}}
				ctx, cancel := context.WithCancel(context.Background())
				s, err := extprocv3.NewExternalProcessorClient(cc).Process(ctx)
				if err != nil {
					cancel()
					continue
				}
				start := time.Now()
				s.Send(env.requestHeaders("POST", "/pkg.Svc/Call", h, false))
				resp, err := s.Recv()
				took := time.Since(start)
				if err != nil {
					cancel()
					continue
				}
				mu.Lock()
				times = append(times, took)
				if resp.GetImmediateResponse() != nil {
					refused++
				}
				mu.Unlock()
				if resp.GetImmediateResponse() == nil {
					time.Sleep(20 * time.Millisecond) // the upstream's time, slot held
					s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}})
					s.Recv()
				}
				s.CloseSend()
				cancel()
			}
		}()
	}
	wg.Wait()
	slices.Sort(times)
	q := func(p float64) time.Duration { return times[min(int(p*float64(len(times))), len(times)-1)] }
	t.Logf("%d decisions, %d refused: p50 %v, p99 %v, max %v (DecisionTimeout 150 ms, message_timeout 200 ms)",
		len(times), refused, q(0.5), q(0.99), times[len(times)-1])
	if max := times[len(times)-1]; max >= 200*time.Millisecond {
		t.Errorf("a decision took %v: Envoy's message_timeout (200 ms) would have let its request through", max)
	}
}
