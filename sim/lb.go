package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/loadreport"
	"github.com/triagehq/triage/subset"
)

// LBConfig configures the lb scenario: SRE book ch. 20, "Load Balancing
// Policies". Zero fields take the defaults; the complicating factors are
// all on by default except unequal clients.
type LBConfig struct {
	// Clients and Backends are the tasks on each side. Default 1000 each.
	Clients, Backends int
	// Subset is each client's subset size (deterministic subsetting).
	// Default 20.
	Subset int
	// Requests is how many requests each policy's run simulates. Default
	// 10,000,000 (about 34 s of virtual time at the default sizes: a
	// run's noise falls with the requests each backend sees, since a
	// hundredth of them cost 100x).
	Requests int
	// Policies are the policies compared. Default round robin,
	// least-loaded and weighted round robin.
	Policies []balance.Policy
	// Load is the offered load as a share of the backends' total
	// capacity. Default 0.7.
	Load float64
	// Duration is the virtual time each run spans; the unit cost of a
	// request follows from it, the load and the request count. Default
	// 60 s. Spread and waste are measured over the second half.
	Duration time.Duration

	// The book's complicating factors ("Simple Round Robin"): request
	// costs varying up to 1000x (UniformCosts: all cost 1x); machine
	// diversity, half the backends twice as fast (UniformMachines: all
	// alike); antagonistic neighbours slowing or speeding each backend by
	// up to 20%, redrawn every 10 s (NoAntagonists); task restarts, one
	// backend every 5 s out for 1 s and then, warming up, needing twice
	// the CPU per request for 30 s (NoRestarts); and clients of unequal
	// rates, a tenth of them sending ten times as much (UnequalClients).
	UniformCosts, UniformMachines, NoAntagonists, NoRestarts, UnequalClients bool

	Seed uint64
}

const (
	lbMaxTasks    = 10000
	lbMaxRequests = 100_000_000
	lbSlots       = 4                  // worker slots (cores) per backend
	lbReportEvery = int64(time.Second) // a backend refreshes its load report
	lbReportRing  = 10                 // reports cover the last 10 s, like the Meter's rates
	lbAntagonist  = int64(10 * time.Second)
	lbRestartGap  = int64(5 * time.Second)
	lbRestartFor  = int64(time.Second)
	lbWarmFor     = int64(30 * time.Second) // after a restart, costs double
	lbQueueCap    = 10000                   // a backend's queue: past it, requests fail at once
)

func (c *LBConfig) defaults() error {
	if c.Clients == 0 {
		c.Clients = 1000
	}
	if c.Backends == 0 {
		c.Backends = 1000
	}
	if c.Subset == 0 {
		c.Subset = min(20, c.Backends)
	}
	if c.Requests == 0 {
		c.Requests = 10_000_000
	}
	if len(c.Policies) == 0 {
		c.Policies = []balance.Policy{balance.RoundRobin, balance.LeastLoaded, balance.WeightedRoundRobin}
	}
	if c.Load == 0 {
		c.Load = 0.7
	}
	if c.Duration == 0 {
		c.Duration = time.Minute
	}
	switch {
	case c.Clients < 1 || c.Clients > lbMaxTasks || c.Backends < 2 || c.Backends > lbMaxTasks:
		return fmt.Errorf("sim: clients must be in [1, %d] and backends in [2, %d]", lbMaxTasks, lbMaxTasks)
	case c.Subset < 1 || c.Subset > c.Backends:
		return errors.New("sim: subset must be in [1, backends]")
	case c.Requests < 1000 || c.Requests > lbMaxRequests:
		return fmt.Errorf("sim: requests must be in [1000, %d]", lbMaxRequests)
	case !(c.Load >= 0.05 && c.Load <= 0.95):
		return errors.New("sim: load must be in [0.05, 0.95] of capacity")
	case c.Duration < 10*time.Second || c.Duration > time.Hour:
		return errors.New("sim: duration must be between 10 s and 1 h")
	case len(c.Policies) > 3:
		return errors.New("sim: at most 3 policies")
	}
	for _, p := range c.Policies {
		if p > balance.WeightedRoundRobin {
			return fmt.Errorf("sim: unknown policy %d", p)
		}
	}
	return nil
}

// lbCosts is the request cost mix: multiples of the unit cost and their
// probabilities (cumulative): the book's "the most expensive requests
// consume 1000x (or more) CPU than the cheapest". Mean 2.89x.
var lbCosts = []struct {
	x, cum float64
}{{1, 0.9}, {10, 0.99}, {100, 0.9999}, {1000, 1}}

// LBRow is one policy's outcome.
type LBRow struct {
	Policy balance.Policy
	// Spread is the most loaded backend's utilization over the least
	// loaded's, over the run's second half.
	Spread float64
	// Wasted is the book's wasted CPU, the sum over tasks of CPU[max] -
	// CPU[i], as a share of the CPU reserved if every task is provisioned
	// for the most loaded one's usage.
	Wasted float64
	// MaxUtil and MinUtil are the extremes of utilization; P99Latency the
	// 99th percentile of latency over service time, over the second half.
	MaxUtil, MinUtil float64
	P99Slowdown      float64
	Failed           int
	// Utils is every backend's utilization, sorted.
	Utils []float64
}

// LB runs clients with triage's balance.Balancer over deterministic
// subsets of backends (subset.Deterministic) on virtual time, under each
// policy: the spread of CPU utilization across backend tasks, and the CPU
// wasted. The book: round robin "can result in a spread of up to 2x";
// least-loaded "about as poorly"; weighted round robin "significantly
// reduced the difference".
func LB(cfg LBConfig) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	began := time.Now()
	res := &Result{Scenario: "lb", Seed: cfg.Seed}
	res.Table = [][]string{{"policy", "spread (max/min)", "CPU wasted", "most loaded", "least loaded", "p99 latency / service", "failed"}}
	var rows []LBRow
	for _, p := range cfg.Policies {
		row, err := runLB(cfg, p)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
		res.Table = append(res.Table, []string{p.String(), format(row.Spread), fmt.Sprintf("%.1f%%", 100*row.Wasted),
			format(row.MaxUtil), format(row.MinUtil), format(row.P99Slowdown), fmt.Sprint(row.Failed)})
	}
	for _, r := range rows {
		h := Headline{Name: "utilization spread, " + r.Policy.String(), Value: r.Spread}
		switch r.Policy {
		case balance.RoundRobin:
			h.Book, h.Note = book(2), "book: round robin \"can result in a spread of up to 2x\""
		case balance.LeastLoaded:
			h.Book, h.Note = book(2), "book: least-loaded sees \"twice as much CPU\", \"about as poorly as Round Robin\""
		case balance.WeightedRoundRobin:
			h.Note = "book: \"significantly reduced the difference\" (Figure 20-6, no number)"
		}
		res.Headlines = append(res.Headlines, h)
	}
	dist := Plot{Name: "utilization", Title: "utilization of every backend task, sorted (Figures 20-2 and 20-6)",
		XLabel: "backend tasks, least to most loaded", YLabel: "utilization"}
	for _, r := range rows {
		se := Series{Name: r.Policy.String(), X: make([]float64, len(r.Utils)), Y: r.Utils}
		for i := range se.X {
			se.X[i] = float64(i)
		}
		dist.Series = append(dist.Series, se)
	}
	res.Plots = []Plot{dist}
	for _, r := range rows {
		res.Headlines = append(res.Headlines, Headline{Name: "CPU wasted, " + r.Policy.String(), Value: r.Wasted,
			Note: "sum over tasks of CPU[max] - CPU[i], share of what is reserved"})
	}
	res.Elapsed = time.Since(began)
	return res, nil
}

// vclock is the simulation's clock: single-threaded, read without a lock.
// It has no timers (balance and its Meter use none): NewTimer returns one
// that never fires.
type vclock struct {
	base time.Time
	now  int64
}

func (c *vclock) Now() time.Time                  { return c.base.Add(time.Duration(c.now)) }
func (c *vclock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c *vclock) NewTimer(time.Duration) clock.Timer {
	return idleTimer{}
}

type idleTimer struct{}

func (idleTimer) C() <-chan time.Time      { return nil }
func (idleTimer) Stop() bool               { return false }
func (idleTimer) Reset(time.Duration) bool { return false }

// lbBackend is one backend task: lbSlots worker slots at a speed, a FIFO
// queue, its own load Meter, and the integral of busy slots over time.
type lbBackend struct {
	speed, antagonist float64
	antagonists       bool // redraw antagonist every lbAntagonist
	nextDraw          int64
	busy              int
	queue             []lbReq
	head              int
	busyInt           float64 // slot-ns busy since the start
	lastChange        int64
	measureFrom       float64 // busyInt at the measurement's start
	meter             *loadreport.Meter
	report            balance.Load
	reportAt          int64
	// the busy integral at each of the last lbReportRing reports
	ringAt    [lbReportRing]int64
	ringBusy  [lbReportRing]float64
	ringN     int
	downUntil int64
	warmUntil int64
	refs      []*balance.Endpoint // every client's endpoint for this backend
}

type lbReq struct {
	arrive int64
	cost   float64 // in unit costs
	ep     *balance.Endpoint
}

// lbEvent is a request finishing on a backend.
type lbEvent struct {
	at      int64
	backend int32
	arrive  int64
	svc     int64
	ep      *balance.Endpoint
}

// eventHeap is a binary min-heap on at, without container/heap's
// interface calls.
type eventHeap []lbEvent

func (h *eventHeap) push(e lbEvent) {
	*h = append(*h, e)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if s[p].at <= s[i].at {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h *eventHeap) pop() lbEvent {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	*h = s[:n]
	s = s[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && s[r].at < s[l].at {
			m = r
		}
		if s[i].at <= s[m].at {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	return top
}

func runLB(cfg LBConfig, policy balance.Policy) (LBRow, error) {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6c62))
	vc := &vclock{base: time.Unix(0, 0)}
	backends := make([]*lbBackend, cfg.Backends)
	capacity := 0.0 // requests per second, all backends
	meanCost := 1.0
	if !cfg.UniformCosts {
		meanCost = 0
		prev := 0.0
		for _, c := range lbCosts {
			meanCost += c.x * (c.cum - prev)
			prev = c.cum
		}
	}
	for i := range backends {
		b := &lbBackend{speed: 1, antagonist: 1, antagonists: !cfg.NoAntagonists}
		if !cfg.UniformMachines && i%2 == 1 {
			b.speed = 2
		}
		m, err := loadreport.New(loadreport.WithClock(vc), loadreport.WithWindow(lbReportRing*time.Duration(lbReportEvery)),
			loadreport.WithUtilization(func() float64 { return b.utilization(vc.now) }))
		if err != nil {
			return LBRow{}, err
		}
		b.meter = m
		backends[i] = b
		capacity += lbSlots * b.speed / meanCost // requests per second at a unit cost of 1 s
	}
	// The unit cost (a 1x request on a 1x machine) that makes Requests
	// span Duration at the given load.
	rate := float64(cfg.Requests) / cfg.Duration.Seconds()
	unitCost := cfg.Load * capacity / rate * 1e9 // ns
	// Clients: a balancer each, over its deterministic subset.
	type lbClient struct {
		bal  *balance.Balancer
		back map[*balance.Endpoint]int32
	}
	clients := make([]lbClient, cfg.Clients)
	alg := subset.Deterministic{}
	for c := range clients {
		bal, err := balance.New(balance.WithPolicy(policy), balance.WithClock(vc),
			balance.WithBlackout(time.Second), balance.WithWeightPeriod(time.Second))
		if err != nil {
			return LBRow{}, err
		}
		idx := alg.Subset(cfg.Backends, c, cfg.Subset)
		ids := make([]string, len(idx))
		for k, j := range idx {
			ids[k] = fmt.Sprint(j)
		}
		eps, err := bal.SetEndpoints(ids)
		if err != nil {
			return LBRow{}, err
		}
		back := make(map[*balance.Endpoint]int32, len(eps))
		for k, e := range eps {
			e.SetState(balance.Healthy)
			back[e] = int32(idx[k])
			backends[idx[k]].refs = append(backends[idx[k]].refs, e)
		}
		clients[c] = lbClient{bal, back}
	}
	// Client rates: cumulative weights for picking the sender.
	cum := make([]float64, cfg.Clients)
	total := 0.0
	for c := range cum {
		w := 1.0
		if cfg.UnequalClients && c%10 == 0 {
			w = 10
		}
		total += w
		cum[c] = total
	}
	var events eventHeap
	var slow slowdownHist
	measureAt := cfg.Requests / 2
	var measureStart int64
	failed := 0
	nextRestart := lbRestartGap
	finish := func(ev lbEvent) {
		vc.now = ev.at
		b := backends[ev.backend]
		b.advance(ev.at)
		b.busy--
		b.meter.Record(false)
		if ev.at-b.reportAt >= lbReportEvery {
			b.report = b.meter.Load()
			b.reportAt = ev.at
			k := b.ringN % lbReportRing
			b.ringAt[k], b.ringBusy[k] = ev.at, b.busyInt
			b.ringN++
		}
		ev.ep.Done(false)
		ev.ep.Report(b.report)
		if ev.arrive >= measureStart && measureStart > 0 && ev.svc > 0 {
			slow.add(float64(ev.at-ev.arrive) / float64(ev.svc))
		}
		if b.head < len(b.queue) {
			r := b.queue[b.head]
			b.queue[b.head] = lbReq{}
			b.head++
			if b.head == len(b.queue) {
				b.queue, b.head = b.queue[:0], 0
			}
			b.start(ev.at, ev.backend, r, unitCost, &events, rng)
		}
	}
	now := int64(0)
	for n := 0; n < cfg.Requests; n++ {
		now += int64(rng.ExpFloat64() / rate * 1e9)
		for len(events) > 0 && events[0].at <= now {
			finish(events.pop())
		}
		vc.now = now
		if n == measureAt {
			measureStart = now
			for _, b := range backends {
				b.advance(now)
				b.measureFrom = b.busyInt
			}
		}
		if !cfg.NoRestarts {
			for now >= nextRestart {
				j := rng.IntN(len(backends))
				backends[j].downUntil = nextRestart + lbRestartFor
				backends[j].warmUntil = nextRestart + lbRestartFor + lbWarmFor
				for _, e := range backends[j].refs {
					e.SetState(balance.Refusing)
				}
				nextRestart += lbRestartGap
			}
		}
		c := &clients[searchCum(cum, rng.Float64()*total)]
		e, err := c.bal.Pick()
		if err != nil {
			failed++
			continue
		}
		j := c.back[e]
		b := backends[j]
		cost := 1.0
		if !cfg.UniformCosts {
			u := rng.Float64()
			for _, k := range lbCosts {
				if u < k.cum {
					cost = k.x
					break
				}
			}
		}
		r := lbReq{arrive: now, cost: cost, ep: e}
		if b.busy < lbSlots {
			b.start(now, j, r, unitCost, &events, rng)
		} else if len(b.queue)-b.head < lbQueueCap {
			b.queue = append(b.queue, r)
		} else {
			failed++
			e.Refused() // the backend's own refusal: its queue is full
		}
		// Backends back from a restart: healthy again for every client.
		if !cfg.NoRestarts && n%1024 == 0 {
			for _, b := range backends {
				if b.downUntil != 0 && now >= b.downUntil {
					b.downUntil = 0
					for _, e := range b.refs {
						e.SetState(balance.Healthy)
					}
				}
			}
		}
	}
	end := now
	var utils []float64
	for _, b := range backends {
		b.advance(end)
		utils = append(utils, (b.busyInt-b.measureFrom)/float64(lbSlots)/float64(end-measureStart))
	}
	row := LBRow{Policy: policy, Failed: failed, MaxUtil: slices.Max(utils), MinUtil: slices.Min(utils)}
	slices.Sort(utils)
	row.Utils = utils
	if row.MinUtil > 0 {
		row.Spread = row.MaxUtil / row.MinUtil
	} else {
		row.Spread = math.Inf(1)
	}
	var waste float64
	for _, u := range utils {
		waste += row.MaxUtil - u
	}
	if row.MaxUtil > 0 {
		row.Wasted = waste / (row.MaxUtil * float64(len(utils)))
	}
	row.P99Slowdown = slow.quantile(0.99)
	return row, nil
}

// advance integrates busy slots up to t.
func (b *lbBackend) advance(t int64) {
	b.busyInt += float64(b.busy) * float64(t-b.lastChange)
	b.lastChange = t
}

// utilization is the backend's busy share of its slots since the oldest
// of its last lbReportRing reports (its CPU utilization over the window
// its Meter's rates cover).
func (b *lbBackend) utilization(now int64) float64 {
	b.advance(now)
	var at int64
	var busy float64
	if b.ringN >= lbReportRing {
		k := b.ringN % lbReportRing
		at, busy = b.ringAt[k], b.ringBusy[k]
	}
	if now <= at {
		return b.report.Utilization
	}
	return (b.busyInt - busy) / float64(lbSlots) / float64(now-at)
}

// start runs r on a free slot of backend j.
func (b *lbBackend) start(now int64, j int32, r lbReq, unitCost float64, events *eventHeap, rng *rand.Rand) {
	if b.antagonists && now >= b.nextDraw {
		b.nextDraw = now + lbAntagonist
		b.antagonist = 0.8 + 0.4*rng.Float64()
	}
	b.advance(now)
	b.busy++
	speed := b.speed * b.antagonist
	if now < b.warmUntil {
		speed /= 2
	}
	svc := int64(r.cost * unitCost / speed)
	events.push(lbEvent{at: now + svc, backend: j, arrive: r.arrive, svc: svc, ep: r.ep})
}

// slowdownHist is a histogram of latency / service time (>= 1) in
// buckets 1% wide, up to 10^4: fixed memory whatever the request count.
type slowdownHist struct {
	n       int
	buckets [slowBuckets]int
}

const slowBuckets = 926 // ln(10^4) / ln(1.01)

func (h *slowdownHist) add(x float64) {
	i := 0
	if x > 1 {
		i = min(int(math.Log(x)/math.Log1p(0.01)), slowBuckets-1)
	}
	h.buckets[i]++
	h.n++
}

// quantile returns the upper edge of the bucket holding quantile q.
func (h *slowdownHist) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	want := int(math.Ceil(q * float64(h.n)))
	seen := 0
	for i, c := range h.buckets {
		seen += c
		if seen >= want {
			return math.Pow(1.01, float64(i+1))
		}
	}
	return math.Pow(1.01, slowBuckets)
}

// searchCum returns the first index whose cumulative weight exceeds x.
func searchCum(cum []float64, x float64) int {
	i, _ := slices.BinarySearch(cum, x)
	if i < len(cum) && cum[i] == x {
		i++
	}
	return min(i, len(cum)-1)
}

// ParsePolicies parses a comma-separated list of policy names.
func ParsePolicies(s string) ([]balance.Policy, error) {
	var ps []balance.Policy
	for _, name := range strings.Split(s, ",") {
		p, err := balance.ParsePolicy(strings.TrimSpace(name))
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}
