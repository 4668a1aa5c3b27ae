package sim

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/triagehq/triage/quota/allocate"
	"github.com/triagehq/triage/quota/usage"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota"
)

// QuotaTreeConfig configures the QuotaTree scenario. Zero fields take the
// defaults in brackets.
type QuotaTreeConfig struct {
	Regions   int           // regional quota servers of the tree [4]
	Tasks     int           // tasks per region at 1x [10]
	Customers int           // customers at 1x [100]
	PerTask   int           // customers each task serves [10]
	Scale     int           // how much tasks and customers grow [10]
	Refresh   time.Duration // how often tasks, and regions, renew their leases [1s]
	Duration  time.Duration // virtual length of each run [40s]
	// Mode is every Allocator's throttling mode [quota.ModeOptimistic]: in
	// ModeOptimistic each level may hand out 5% more than a limit (the
	// floors of tasks without demand), so a tree's two levels 10%.
	Mode quota.Mode
}

func (c *QuotaTreeConfig) defaults() error {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Regions, 4)
	def(&c.Tasks, 10)
	def(&c.Customers, 100)
	def(&c.PerTask, 10)
	def(&c.Scale, 10)
	if c.Refresh == 0 {
		c.Refresh = time.Second
	}
	if c.Duration == 0 {
		c.Duration = 40 * time.Second
	}
	switch {
	case c.Regions < 2 || c.Regions > 16:
		return errors.New("sim: quota tree: regions must be in [2, 16]")
	case c.Tasks < 2 || c.Tasks > 100:
		return errors.New("sim: quota tree: tasks per region must be in [2, 100]")
	case c.Customers < 2 || c.Customers > 200:
		return errors.New("sim: quota tree: customers must be in [2, 200]")
	case c.PerTask < 1 || c.PerTask > c.Customers || c.Regions*c.Tasks*c.PerTask < c.Customers:
		return errors.New("sim: quota tree: customers per task must be in [1, customers], and the tasks must serve every customer")
	case c.Mode > quota.ModePessimistic:
		return errors.New("sim: quota tree: unknown mode")
	case c.Scale < 1 || c.Scale > 10:
		return errors.New("sim: quota tree: scale must be in [1, 10]")
	case c.Refresh < 100*time.Millisecond || c.Refresh > 10*time.Second:
		return errors.New("sim: quota tree: refresh must be in [100ms, 10s]")
	case c.Duration < 10*c.Refresh || c.Duration > 10*time.Minute:
		return errors.New("sim: quota tree: duration must be in [10 refreshes, 10m]")
	}
	return nil
}

// quotaTreeRun is one layout at one scale.
type quotaTreeRun struct {
	layout            string
	tasks, customers  int
	maxRatio, p99     float64 // global usage / limit, over-limit customers' 1 s windows
	served            float64 // served / min(demand, limit), every customer
	rootPerSecond     float64 // refreshes the top server answers per second
	windowsOverMargin int
	windows           int
}

// quotaTreeMargin is the margin the scenario states: a customer's global
// usage in any 1 s window past the warm-up stays within 5% of its limit
// (in ModeOptimistic one level's floors may hand out 5% more; in
// ModePessimistic never more).
const quotaTreeMargin = 0.05

// QuotaTree is the plan past one quota service leader (Doorman's tree) on
// virtual time, with triage's allocate.Allocator and quota.Leased at every
// level: Regions regional servers each lease, from a root, a share of
// every customer's global limit and split it among their Tasks tasks, as
// one Allocator splits it among tasks; the root sees only the regions'
// aggregate demand. It runs the flat layout (every task at one leader)
// and the tree at 1x and at Scale x tasks and customers, on the same
// traffic: half the customers demand 1.5 times their limit, half half of
// it, each spread over the tasks that serve it, and at half-time the
// demand of every customer moves towards other regions' tasks. A task
// serves, for each of its customers, its demand up to the limit it holds
// and refuses the rest, reporting both (hard limits enforced exactly, as
// a fluid: the scenario is about the split, not about enforcement, which
// Throttling covers).
func QuotaTree(cfg QuotaTreeConfig) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	began := time.Now()
	res := &Result{Scenario: "quota-tree"}
	mode := cfg.Mode.String()
	res.Table = [][]string{{"layout", "tasks", "customers", "max usage / limit", "p99 usage / limit", "windows > limit +5%", "served / min(demand, limit)", "refreshes/s at the top"}}
	var runs []quotaTreeRun
	for _, scale := range []int{1, cfg.Scale} {
		for _, tree := range []bool{false, true} {
			r, err := runQuotaTree(cfg, scale, tree)
			if err != nil {
				return nil, err
			}
			runs = append(runs, r)
			res.Table = append(res.Table, []string{r.layout, strconv.Itoa(r.tasks), strconv.Itoa(r.customers), format(r.maxRatio), format(r.p99),
				fmt.Sprintf("%d of %d", r.windowsOverMargin, r.windows), format(r.served), format(r.rootPerSecond)})
			res.Headlines = append(res.Headlines,
				Headline{Name: fmt.Sprintf("p99 global usage / limit, %s, %s, %d tasks x %d customers", mode, r.layout, r.tasks, r.customers), Value: r.p99,
					Note: "over-limit customers' 1 s windows; the stated margin: within 5% of the limit"},
				Headline{Name: fmt.Sprintf("max global usage / limit, %s, %s, %d tasks x %d customers", mode, r.layout, r.tasks, r.customers), Value: r.maxRatio},
				Headline{Name: fmt.Sprintf("served / min(demand, limit), %s, %s, %d tasks x %d customers", mode, r.layout, r.tasks, r.customers), Value: r.served})
		}
		if cfg.Scale == 1 {
			break
		}
	}
	plot := Plot{Name: "usage", Title: "over-limit customers' global usage per 1 s window (" + mode + ")", YLabel: "usage / limit",
		Series: []Series{{Name: "p99"}, {Name: "max"}}}
	for _, r := range runs {
		plot.Categories = append(plot.Categories, fmt.Sprintf("%s, %d tasks", r.layout, r.tasks))
		plot.Series[0].Y = append(plot.Series[0].Y, r.p99)
		plot.Series[1].Y = append(plot.Series[1].Y, r.maxRatio)
	}
	res.Plots = []Plot{plot}
	res.Elapsed = time.Since(began)
	return res, nil
}

// treeTask is one task of the scenario.
type treeTask struct {
	name      string
	region    int
	customers []int
	usage     *usage.Table
	leased    *quota.Leased
	next      time.Duration
	refused   []float64 // per customer, refusals owed
}

// treeRegion is one regional server: an Allocator over its tasks, whose
// policy is its lease from the root.
type treeRegion struct {
	name   string
	alloc  *allocate.Allocator
	leased *quota.Leased
	next   time.Duration
}

func runQuotaTree(cfg QuotaTreeConfig, scale int, tree bool) (quotaTreeRun, error) {
	clk := clock.NewFake(time.Unix(0, 0))
	nTasks, nCust := cfg.Regions*cfg.Tasks*scale, cfg.Customers*scale
	lease := 5 * cfg.Refresh
	limits := make([]float64, nCust)
	demand := make([]float64, nCust) // global, CPU-seconds per second
	global := map[string]quota.Limit{}
	name := func(c int) string { return "c" + strconv.Itoa(c) }
	for c := range nCust {
		limits[c] = float64(1 + c%5)
		demand[c] = limits[c] * map[bool]float64{true: 1.5, false: 0.5}[c%2 == 0]
		global[name(c)] = quota.Limit{CPU: limits[c], Hard: true}
	}
	allocOpts := []allocate.Option{allocate.WithClock(clk), allocate.WithLease(lease), allocate.WithRefresh(cfg.Refresh),
		allocate.WithMaxTasks(max(nTasks, 16)), allocate.WithMode(cfg.Mode)}
	newAlloc := func(lim map[string]quota.Limit, tasks int) (*allocate.Allocator, error) {
		p, err := quota.New(quota.Config{Tasks: tasks, Fallback: quota.Safe, Customers: lim})
		if err != nil {
			return nil, err
		}
		return allocate.New(p, allocOpts...)
	}
	// The top: one leader for every task (flat), or the root for the
	// regions (tree).
	topTasks := nTasks
	if tree {
		topTasks = cfg.Regions
	}
	top, err := newAlloc(global, topTasks)
	if err != nil {
		return quotaTreeRun{}, err
	}
	var regions []*treeRegion
	if tree {
		for r := range cfg.Regions {
			// Until its first lease a region splits the static share of
			// every limit (the root's safe fallback).
			share := map[string]quota.Limit{}
			for c := range nCust {
				share[name(c)] = quota.Limit{CPU: limits[c] / float64(cfg.Regions), Hard: true}
			}
			a, err := newAlloc(share, nTasks/cfg.Regions)
			if err != nil {
				return quotaTreeRun{}, err
			}
			regions = append(regions, &treeRegion{name: "region-" + strconv.Itoa(r), alloc: a, leased: quota.NewLeased(clk, nil),
				next: time.Duration(r) * cfg.Refresh / time.Duration(cfg.Regions)})
		}
	}
	tasks := make([]*treeTask, nTasks)
	servedBy := make([][]int, nCust) // the tasks of each customer
	for i := range tasks {
		u, err := usage.New(usage.WithClock(clk))
		if err != nil {
			return quotaTreeRun{}, err
		}
		t := &treeTask{name: "task-" + strconv.Itoa(i), region: i % cfg.Regions, usage: u, leased: quota.NewLeased(clk, nil),
			next: time.Duration(i) * cfg.Refresh / time.Duration(nTasks)}
		// Task i serves a block of customers after task i-1's, round the
		// customers as often as the tasks go: each customer is served by
		// tasks x per-task / customers tasks, in several regions.
		for j := range cfg.PerTask {
			c := (i*cfg.PerTask + j) % nCust
			if !slices.Contains(t.customers, c) {
				t.customers = append(t.customers, c)
				servedBy[c] = append(servedBy[c], i)
			}
		}
		t.refused = make([]float64, len(t.customers))
		tasks[i] = t
	}
	// Each task's demand for each of its customers: the customer's
	// demand spread over its tasks, three times as much on the tasks of
	// the first half of the regions as on the others; at half-time the
	// halves swap.
	perTask := func(t *treeTask, c int, hot bool) float64 {
		var w, sum float64
		for _, i := range servedBy[c] {
			v := 1.0
			if (tasks[i].region < cfg.Regions/2) == hot {
				v = 3
			}
			sum += v
			if tasks[i] == t {
				w = v
			}
		}
		return demand[c] * w / sum
	}
	const step = 100 * time.Millisecond
	windows := int(cfg.Duration / time.Second)
	used := make([][]float64, nCust) // per customer, per 1 s window
	for c := range used {
		used[c] = make([]float64, windows)
	}
	dem := make([][]float64, len(tasks)) // per task, per customer index
	topRefreshes := 0
	for now := time.Duration(0); now < cfg.Duration; now += step {
		hot := now < cfg.Duration/2
		if now == 0 || now == cfg.Duration/2 {
			for i, t := range tasks {
				dem[i] = dem[i][:0]
				for _, c := range t.customers {
					dem[i] = append(dem[i], perTask(t, c, hot))
				}
			}
		}
		for _, r := range regions {
			if now < r.next {
				continue
			}
			r.next += cfg.Refresh
			var rep quota.Report
			rep.Task = r.name
			for _, g := range r.alloc.Usage() {
				rep.Customers = append(rep.Customers, usage.Customer{Customer: g.Customer, Used: g.Used, Demand: g.Demand, Share: r.leased.Share(g.Customer)})
			}
			ls, err := top.Refresh(rep)
			if err != nil {
				return quotaTreeRun{}, err
			}
			topRefreshes++
			if err := r.leased.Set(ls); err != nil {
				return quotaTreeRun{}, err
			}
			lim := make(map[string]quota.Limit, nCust)
			for c := range nCust {
				v, _ := r.leased.Limit(name(c), criticality.Sheddable)
				lim[name(c)] = quota.Limit{CPU: v, Hard: true}
			}
			p, err := quota.New(quota.Config{Tasks: nTasks / cfg.Regions, Fallback: quota.Safe, Customers: lim})
			if err != nil {
				return quotaTreeRun{}, err
			}
			r.alloc.SetPolicy(p)
		}
		w := int(now / time.Second)
		for i, t := range tasks {
			if now >= t.next {
				t.next += cfg.Refresh
				snap := t.usage.Snapshot()
				for j := range snap {
					snap[j].Share = t.leased.Share(snap[j].Customer)
				}
				at := top
				if tree {
					at = regions[t.region].alloc
				} else {
					topRefreshes++
				}
				ls, err := at.Refresh(quota.Report{Task: t.name, Customers: snap})
				if err != nil {
					return quotaTreeRun{}, err
				}
				if err := t.leased.Set(ls); err != nil {
					return quotaTreeRun{}, err
				}
			}
			for j, c := range t.customers {
				// Work arrives at the demand's rate; what the limit held
				// lets through is served (one request a step), the rest is
				// refused, as requests of the served one's cost, so that
				// the task reports it in its demand.
				lim, _ := t.leased.Limit(name(c), criticality.Sheddable)
				d := dem[i][j] * step.Seconds()
				served := min(d, lim*step.Seconds())
				cost := served
				if served > 0 {
					t.usage.Add(name(c), criticality.Sheddable, time.Duration(served*float64(time.Second)))
					used[c][w] += served
				} else {
					cost = 1e-3 // none served: the Usage counts 1 ms each
				}
				t.refused[j] = min(t.refused[j]+(d-served)/cost, 1000)
				for ; t.refused[j] >= 1; t.refused[j]-- {
					t.usage.Refused(name(c))
				}
			}
		}
		clk.Advance(step)
	}
	run := quotaTreeRun{layout: map[bool]string{false: "flat", true: "tree"}[tree], tasks: nTasks, customers: nCust,
		rootPerSecond: float64(topRefreshes) / cfg.Duration.Seconds()}
	// Past the warm-up: learning (a lease) and the demand estimate
	// settling (a few refreshes). The demand's move at half-time counts.
	from := int((lease + 5*cfg.Refresh) / time.Second)
	var ratios []float64
	var served, wanted float64
	for c := range nCust {
		for w := from; w < windows; w++ {
			served += used[c][w]
			wanted += min(demand[c], limits[c])
			if demand[c] <= limits[c] {
				continue
			}
			r := used[c][w] / limits[c]
			ratios = append(ratios, r)
			run.maxRatio = max(run.maxRatio, r)
			if r > 1+quotaTreeMargin {
				run.windowsOverMargin++
			}
		}
	}
	run.windows = len(ratios)
	if len(ratios) > 0 {
		slices.Sort(ratios)
		run.p99 = ratios[min(len(ratios)-1, len(ratios)*99/100)]
	}
	run.served = served / wanted
	return run, nil
}
