package balancing

// Issue 5 over loopback sockets: triage's balancer (subsetting, flow
// control, round robin, least-loaded, weighted round robin from ORCA load
// reports) beside grpc-go's own policies, on backends of two speeds.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	_ "google.golang.org/grpc/balancer/leastrequest"       // grpc-go's least_request, for comparison
	_ "google.golang.org/grpc/balancer/weightedroundrobin" // grpc-go's weighted_round_robin, for comparison
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/loadreport"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/lb"
)

var registerOnce sync.Once

func registerBalancer() {
	registerOnce.Do(func() { lb.Register(lb.WithIsolation(e2eIsolation)) })
}

// slotBackend emulates a machine of some speed with worker slots: each
// request holds a slot for the service time, and waits for one if all are
// busy. Utilization is the busy share of the slots.
type slotBackend struct {
	addr    string
	slots   chan struct{}
	service time.Duration
	failAll atomic.Bool
	served  atomic.Int64
	busyNs  atomic.Int64 // total slot-time held
	meter   *loadreport.Meter
	srv     *grpc.Server

	mu    sync.Mutex
	marks []busyMark // for the utilization of the last second
}

type busyMark struct {
	at   time.Time
	busy int64
}

// utilization is the busy share of the slots over about the last second.
func (b *slotBackend) utilization() float64 {
	now, busy := time.Now(), b.busyNs.Load()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.marks = append(b.marks, busyMark{now, busy})
	for len(b.marks) > 2 && now.Sub(b.marks[1].at) > time.Second {
		b.marks = b.marks[1:]
	}
	first := b.marks[0]
	d := now.Sub(first.at)
	if d < 50*time.Millisecond {
		return 0
	}
	return float64(busy-first.busy) / float64(d) / float64(cap(b.slots))
}

func startSlotBackend(t *testing.T, slots int, service time.Duration) *slotBackend {
	t.Helper()
	b := &slotBackend{slots: make(chan struct{}, slots), service: service}
	m, err := loadreport.New(loadreport.WithWindow(2*time.Second), loadreport.WithUtilization(b.utilization))
	if err != nil {
		t.Fatal(err)
	}
	b.meter = m
	hs := health.NewServer()
	srvTriage, err := triagegrpc.NewServer(triagegrpc.WithLoadReports(m))
	if err != nil {
		t.Fatal(err)
	}
	b.srv = grpc.NewServer(srvTriage.ServerOptions()...)
	healthpb.RegisterHealthServer(b.srv, hs)
	relay.Register(b.srv, &relay.Tier{Name: "B", Fail: func(ctx context.Context, body string) error {
		if b.failAll.Load() {
			return status.Error(codes.Unavailable, "unhealthy task")
		}
		select {
		case b.slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		start := time.Now()
		time.Sleep(b.service) // the emulated work: a slot held for the service time
		b.busyNs.Add(int64(time.Since(start)))
		<-b.slots
		b.served.Add(1)
		return nil
	}})
	b.addr = loopback.ServeGRPC(t, b.srv)
	return b
}

// lbConn dials every backend through a manual resolver with the given
// service config, and any further options.
func lbConn(t *testing.T, addrs []string, serviceConfig string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	registerBalancer()
	r := manual.NewBuilderWithScheme("lbtest")
	var eps []resolver.Endpoint
	for _, a := range addrs {
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
	}
	r.InitialState(resolver.State{Endpoints: eps})
	cc, err := grpc.NewClient(r.Scheme()+":///backends", append([]grpc.DialOption{grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(serviceConfig)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

type loadResult struct {
	sent, ok, failed int
	p99              time.Duration
}

// openLoop sends rate requests per second for d (bounded in count and
// time), each with a 1 s deadline, and waits for all of them.
func openLoop(cc grpc.ClientConnInterface, rate int, d time.Duration) loadResult {
	n := int(float64(rate) * d.Seconds())
	lat := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		at := time.Duration(float64(i) / float64(rate) * float64(time.Second))
		if wait := time.Until(start.Add(at)); wait > 0 {
			time.Sleep(wait)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			t0 := time.Now()
			_, errs[i] = relay.Invoke(ctx, cc, "x")
			lat[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	r := loadResult{sent: n}
	var okLat []time.Duration
	for i, err := range errs {
		if err == nil {
			r.ok++
			okLat = append(okLat, lat[i])
		} else {
			r.failed++
		}
	}
	if len(okLat) > 0 {
		slices.Sort(okLat)
		r.p99 = okLat[len(okLat)*99/100]
	}
	return r
}

type spreadRow struct {
	name   string
	spread float64
	utils  []float64
	res    loadResult
}

// TestBalancingSpread: two slow backends (2 slots) and two fast ones (4
// slots), 20 ms of work per request, so capacity is 100 and 200 req/s;
// clients offer 70% of the 600 req/s total. Round robin gives each backend
// the same rate and saturates the slow ones; weighted round robin, fed by
// the backends' ORCA reports, gives the fast ones twice as much. The
// spreads and tail latencies compared are measured over wall-clock
// seconds, so this is a measurement, not part of go test ./...:
// TRIAGE_MEASURE=1 go test -count=1 -run TestBalancingSpread -v ./test/e2e
func TestBalancingSpread(t *testing.T) {
	if os.Getenv("TRIAGE_MEASURE") != "1" || testing.Short() {
		t.Skip("a measurement of about a minute of real load: TRIAGE_MEASURE=1 go test -count=1 -run TestBalancingSpread -v ./test/e2e")
	}
	const service = 20 * time.Millisecond
	backends := []*slotBackend{
		startSlotBackend(t, 2, service), startSlotBackend(t, 4, service),
		startSlotBackend(t, 2, service), startSlotBackend(t, 4, service),
	}
	var addrs []string
	for _, b := range backends {
		addrs = append(addrs, b.addr)
	}
	const rate = 420 // 70% of 600 req/s
	policies := []struct{ name, config string }{
		{"triage round_robin", `{"loadBalancingConfig":[{"triage":{"policy":"round_robin"}}]}`},
		{"triage least_loaded", `{"loadBalancingConfig":[{"triage":{"policy":"least_loaded"}}]}`},
		{"triage weighted_round_robin", `{"loadBalancingConfig":[{"triage":{"policy":"weighted_round_robin","blackout":"1s","weightPeriod":"250ms"}}]}`},
		{"grpc round_robin", `{"loadBalancingConfig":[{"round_robin":{}}]}`},
		{"grpc least_request", `{"loadBalancingConfig":[{"least_request_experimental":{"choiceCount":2}}]}`},
		{"grpc weighted_round_robin", `{"loadBalancingConfig":[{"weighted_round_robin":{"blackoutPeriod":"1s","weightUpdatePeriod":"0.25s"}}]}`},
	}
	var rows []spreadRow
	for _, p := range policies {
		cc := lbConn(t, addrs, p.config)
		openLoop(cc, rate, 3*time.Second) // warm-up: connections, weights
		before := make([]int64, len(backends))
		for i, b := range backends {
			before[i] = b.busyNs.Load()
		}
		t0 := time.Now()
		res := openLoop(cc, rate, 4*time.Second)
		el := time.Since(t0)
		row := spreadRow{name: p.name, res: res}
		for i, b := range backends {
			row.utils = append(row.utils, float64(b.busyNs.Load()-before[i])/float64(el)/float64(cap(b.slots)))
		}
		row.spread = slices.Max(row.utils) / slices.Min(row.utils)
		rows = append(rows, row)
		cc.Close()
		time.Sleep(500 * time.Millisecond) // let queues drain between policies
	}
	var tbl strings.Builder
	fmt.Fprintf(&tbl, "\n%-28s %7s %6s %6s %8s  utilization slow/fast/slow/fast\n", "policy", "spread", "ok", "failed", "p99")
	for _, r := range rows {
		fmt.Fprintf(&tbl, "%-28s %7.2f %6d %6d %8v  %.2f\n", r.name, r.spread, r.res.ok, r.res.failed, r.res.p99.Round(time.Millisecond), r.utils)
	}
	t.Log(tbl.String())
	byName := map[string]spreadRow{}
	for _, r := range rows {
		byName[r.name] = r
	}
	if s := byName["triage weighted_round_robin"].spread; s > 1.15 {
		t.Errorf("weighted round robin: utilization spread %.2f, want at most 1.15", s)
	}
	if s := byName["triage round_robin"].spread; s < 1.6 {
		t.Errorf("round robin: utilization spread %.2f, want at least 1.6 (the test does not reproduce machine diversity)", s)
	}
	// Each of ours against grpc-go's counterpart on the same backends, in
	// the same run: no worse in spread or p99 (within run-to-run noise:
	// 5% + 0.02 of spread, 20% + 5 ms of p99).
	for _, pair := range [][2]string{
		{"triage round_robin", "grpc round_robin"},
		{"triage least_loaded", "grpc least_request"},
		{"triage weighted_round_robin", "grpc weighted_round_robin"},
	} {
		ours, theirs := byName[pair[0]], byName[pair[1]]
		if ours.spread > theirs.spread*1.05+0.02 || ours.res.p99 > theirs.res.p99*12/10+5*time.Millisecond {
			t.Errorf("%s (spread %.2f, p99 %v) is worse than %s (%.2f, %v)", pair[0], ours.spread, ours.res.p99, pair[1], theirs.spread, theirs.res.p99)
		}
	}
}

// TestLeastLoadedSinkhole: four equal backends, one of which answers every
// request at once with an error. Least-loaded round robin that counts
// recent errors as active requests gives it no more than its fair share;
// counting active requests only (triage with errorWeight 0, and grpc-go's
// least_request) sends it far more, because it always looks idle. It runs
// 16 s of real load, so only with TRIAGE_MEASURE=1 (CI runs it); go test
// ./... checks the mechanism on virtual time (balance's
// TestLeastLoadedCountsErrors).
func TestLeastLoadedSinkhole(t *testing.T) {
	if testing.Short() || !measuring() {
		t.Skip("16 s of real load: TRIAGE_MEASURE=1")
	}
	var addrs []string
	for i := range 4 {
		b := startSlotBackend(t, 4, 20*time.Millisecond)
		if i == 2 {
			b.failAll.Store(true)
		}
		addrs = append(addrs, b.addr)
	}
	share := func(config string) (float64, loadResult) {
		cc := lbConn(t, addrs, config)
		openLoop(cc, 50, time.Second) // connect
		res := openLoop(cc, 300, 3*time.Second)
		cc.Close()
		return float64(res.failed) / float64(res.sent), res
	}
	with, _ := share(`{"loadBalancingConfig":[{"triage":{"policy":"least_loaded"}}]}`)
	without, _ := share(`{"loadBalancingConfig":[{"triage":{"policy":"least_loaded","errorWeight":0}}]}`)
	grpcLR, _ := share(`{"loadBalancingConfig":[{"least_request_experimental":{"choiceCount":2}}]}`)
	rr, _ := share(`{"loadBalancingConfig":[{"triage":{"policy":"round_robin"}}]}`)
	t.Logf("share of requests sent to the failing backend (fair share 0.25): least_loaded %.3f, without counting errors %.3f, grpc least_request %.3f, round robin %.3f", with, without, grpcLR, rr)
	if with > 0.25 {
		t.Errorf("least_loaded counting errors sent %.3f of requests to the failing backend, more than its fair share", with)
	}
	if without < 0.5 {
		t.Errorf("least_loaded without errors counted sent only %.3f to the failing backend: the test does not reproduce sinkholing", without)
	}
}

// TestSubsetOverLoopback: with subsetSize 2 of 4 backends, each client
// connects to and sends to its own subset only, and clients 0 and 1 (one
// round) cover all four backends between them.
func TestSubsetOverLoopback(t *testing.T) {
	var backends []*slotBackend
	var addrs []string
	for range 4 {
		b := startSlotBackend(t, 8, time.Millisecond)
		backends = append(backends, b)
		addrs = append(addrs, b.addr)
	}
	covered := map[int]bool{}
	for client := range 2 {
		before := make([]int64, 4)
		for i, b := range backends {
			before[i] = b.served.Load()
		}
		cc := lbConn(t, addrs, fmt.Sprintf(`{"loadBalancingConfig":[{"triage":{"subsetSize":2,"clientId":%d}}]}`, client))
		for range 40 {
			if _, err := relay.Invoke(context.Background(), cc, "x"); err != nil {
				t.Fatal(err)
			}
		}
		cc.Close()
		var got []int
		for i, b := range backends {
			if b.served.Load() > before[i] {
				got = append(got, i)
				covered[i] = true
			}
		}
		if len(got) != 2 {
			t.Fatalf("client %d reached backends %v, want a subset of 2", client, got)
		}
	}
	if len(covered) != 4 {
		t.Fatalf("clients 0 and 1 covered %v, want all four backends", covered)
	}
}
