package app

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/triagehq/triage/cmd/triage/internal/report"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/sim"
	"github.com/triagehq/triage/subset"
)

const simUsage = `Usage:
  triage sim subsetting [flags]   connections per backend under a subsetting
                                  algorithm (SRE book Figures 20-3 to 20-5)
  triage sim lb [flags]           CPU spread across backend tasks under round robin,
                                  least-loaded and weighted round robin, with the
                                  book's complicating factors (Figure 20-6)
  triage sim throttle [flags]     client-side throttling: backend rejections per
                                  acceptance against K and demand, and recovery
  triage sim retry [flags]        attempts per request with and without the retry
                                  budget, and the attempts histogram (Figure 21-1)
  triage sim shed [flags]         the CRE post's Procrustean shedder against
                                  criticality-aware admission: goodput per criticality
  triage sim cascade [flags]      tasks near capacity lose some of their number:
                                  with triage the rest serve their capacity, without
                                  it the failure cascades
  triage sim stack [flags]        attempts reaching an overloaded DB through the
                                  stack of Figure 21-2, with and without triage's rule
  triage sim throttling [flags]   the CRE post's optimistic and pessimistic throttling:
                                  a customer's global usage per 1 s window against its
                                  limit while its demand surges and moves between tasks
  triage sim quota-tree [flags]   the quota service past one leader (Doorman's tree):
                                  regional servers leasing from a root, against one
                                  leader, as tasks and customers grow 10x
`

func runSim(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "subsetting":
			return runSimSubsetting(args[1:], stdout, stderr)
		case "lb", "throttle", "retry", "stack", "shed", "cascade", "throttling", "quota-tree":
			return runSimScenario(args[0], args[1:], stdout, stderr)
		case "-h", "--help", "help":
			fmt.Fprint(stdout, simUsage)
			return 0
		}
	}
	fmt.Fprint(stderr, simUsage)
	return 2
}

// runSimScenario runs one of package sim's scenarios and prints its
// Result as a table or, with -json, as one JSON object.
func runSimScenario(name string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("triage sim "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	seed := fs.Uint64("seed", 1, "random seed (runs are reproducible)")
	asJSON := fs.Bool("json", false, "print one JSON object: scenario, headlines (name, value, book), table")
	out := fs.String("out", "", "also write result.json, the figures (SVG) and index.html, a self-contained page, to this directory")
	run := simScenarios[name](fs, seed)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "triage sim %s: unexpected argument %q\n", name, fs.Arg(0))
		return 2
	}
	r, err := run()
	if err != nil {
		fmt.Fprintf(stderr, "triage sim %s: %v\n", name, err)
		return 2
	}
	if code := writeOut(*out, r, stderr); code != 0 {
		return code
	}
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(r); err != nil {
			fmt.Fprintf(stderr, "triage sim %s: %v\n", name, err)
			return 1
		}
		return 0
	}
	if err := r.WriteText(stdout); err != nil {
		fmt.Fprintf(stderr, "triage sim %s: %v\n", name, err)
		return 1
	}
	return 0
}

// simScenarios declare each scenario's flags on a FlagSet and return
// the run that reads them once parsed.
var simScenarios = map[string]func(fs *flag.FlagSet, seed *uint64) func() (*sim.Result, error){
	"throttle":   simThrottleFlags,
	"retry":      simRetryFlags,
	"lb":         simLBFlags,
	"shed":       simShedFlags,
	"cascade":    simCascadeFlags,
	"throttling": simThrottlingFlags,
	"stack":      simStackFlags,
	"quota-tree": simQuotaTreeFlags,
}

func simQuotaTreeFlags(fs *flag.FlagSet, _ *uint64) func() (*sim.Result, error) {
	regions := fs.Int("regions", 4, "regional quota servers (2-16)")
	tasks := fs.Int("tasks", 10, "tasks per region at 1x (2-100)")
	customers := fs.Int("customers", 100, "customers at 1x (2-200)")
	perTask := fs.Int("per-task", 10, "customers each task serves (1-customers)")
	scale := fs.Int("scale", 10, "how much tasks and customers grow (1-10)")
	modeName := fs.String("mode", "optimistic", "every quota server's throttling mode: optimistic or pessimistic")
	refresh := fs.Duration("refresh", time.Second, "how often tasks and regions renew their leases (100ms-10s)")
	duration := fs.Duration("duration", 40*time.Second, "virtual length of each run (10 refreshes-10m)")
	return func() (*sim.Result, error) {
		if *regions < 1 || *tasks < 1 || *customers < 1 || *perTask < 1 || *scale < 1 || *refresh <= 0 || *duration <= 0 { // 0 would mean the default
			return nil, errors.New("regions, tasks, customers, per-task, scale, refresh and duration must be positive")
		}
		mode, err := quota.ParseMode(*modeName)
		if err != nil {
			return nil, err
		}
		return sim.QuotaTree(sim.QuotaTreeConfig{Regions: *regions, Tasks: *tasks, Customers: *customers, PerTask: *perTask,
			Scale: *scale, Mode: mode, Refresh: *refresh, Duration: *duration})
	}
}

func simThrottleFlags(fs *flag.FlagSet, seed *uint64) func() (*sim.Result, error) {
	uncapped := fs.Bool("uncapped", false, "the book's formula without triage's 95% cap on local rejection")
	return func() (*sim.Result, error) { return sim.Throttle(sim.ThrottleConfig{Seed: *seed, Uncapped: *uncapped}) }
}

func simRetryFlags(fs *flag.FlagSet, seed *uint64) func() (*sim.Result, error) {
	clients := fs.Int("clients", 100, "clients (1-10000)")
	requests := fs.Int("requests", 1000, "requests per client (1-100000)")
	backends := fs.Int("backends", 100, "backend tasks (1-10000)")
	return func() (*sim.Result, error) {
		if *clients < 1 || *requests < 1 || *backends < 1 { // 0 would mean the default
			return nil, errors.New("clients and backends in [1, 10000], requests in [1, 100000]")
		}
		return sim.Retry(sim.RetryConfig{Clients: *clients, Requests: *requests, Backends: *backends, Seed: *seed})
	}
}

func simLBFlags(fs *flag.FlagSet, seed *uint64) func() (*sim.Result, error) {
	clients := fs.Int("clients", 1000, "client tasks (1-10000)")
	backends := fs.Int("backends", 1000, "backend tasks (2-10000)")
	size := fs.Int("subset", 20, "backends per client (deterministic subsetting)")
	requests := fs.Int("requests", 10000000, "requests simulated per policy (1000-100000000)")
	policies := fs.String("policies", "round_robin,least_loaded,weighted_round_robin", "policies compared, comma-separated")
	load := fs.Float64("load", 0.7, "offered load, share of the backends' capacity (0.05-0.95)")
	uniformCosts := fs.Bool("uniform-costs", false, "every request costs the same (default: costs vary up to 1000x)")
	uniformMachines := fs.Bool("uniform-machines", false, "every machine alike (default: half of them twice as fast)")
	noAntagonists := fs.Bool("no-antagonists", false, "no antagonistic neighbours (default: each backend +-20%, redrawn every 10 s)")
	noRestarts := fs.Bool("no-restarts", false, "no task restarts (default: one backend every 2 s, out for 5 s)")
	unequal := fs.Bool("unequal-clients", false, "a tenth of the clients send ten times as much")
	return func() (*sim.Result, error) {
		ps, err := sim.ParsePolicies(*policies)
		if err != nil {
			return nil, err
		}
		if *clients < 1 || *backends < 1 || *size < 1 || *requests < 1 || *load <= 0 { // 0 would mean the default
			return nil, errors.New("clients, backends, subset, requests and load must be positive")
		}
		return sim.LB(sim.LBConfig{Clients: *clients, Backends: *backends, Subset: *size, Requests: *requests,
			Policies: ps, Load: *load, UniformCosts: *uniformCosts, UniformMachines: *uniformMachines,
			NoAntagonists: *noAntagonists, NoRestarts: *noRestarts, UnequalClients: *unequal, Seed: *seed})
	}
}

func simShedFlags(fs *flag.FlagSet, seed *uint64) func() (*sim.Result, error) {
	cores := fs.Int("cores", 4, "the backend's CPUs (1-256)")
	cost := fs.Duration("cost", time.Millisecond, "CPU per request (10us-1s)")
	deadline := fs.Duration("deadline", time.Second, "every request's deadline (1ms-1m)")
	duration := fs.Duration("duration", 30*time.Second, "virtual length of each run (3s-10m)")
	return func() (*sim.Result, error) {
		if *cores < 1 || *cost <= 0 || *deadline <= 0 || *duration <= 0 { // 0 would mean the default
			return nil, errors.New("cores, cost, deadline and duration must be positive")
		}
		return sim.Shed(sim.ShedConfig{Cores: *cores, Cost: *cost, Deadline: *deadline, Duration: *duration, Seed: *seed})
	}
}

func simCascadeFlags(fs *flag.FlagSet, seed *uint64) func() (*sim.Result, error) {
	tasks := fs.Int("tasks", 10, "backend tasks (2-100)")
	lost := fs.Int("lost", 3, "tasks lost for good at -lose-at")
	loseAt := fs.Duration("lose-at", 20*time.Second, "when the tasks are lost (virtual time)")
	load := fs.Float64("load", 0.8, "demand, share of all tasks' capacity (0-2]")
	duration := fs.Duration("duration", time.Minute, "virtual length of each run (10s-10m)")
	return func() (*sim.Result, error) {
		if *tasks < 1 || *lost < 1 || *loseAt <= 0 || *load <= 0 || *duration <= 0 { // 0 would mean the default
			return nil, errors.New("tasks, lost, lose-at, load and duration must be positive")
		}
		return sim.Cascade(sim.CascadeConfig{Tasks: *tasks, Lost: *lost, LoseAt: *loseAt, Load: *load, Duration: *duration, Seed: *seed})
	}
}

func simThrottlingFlags(fs *flag.FlagSet, seed *uint64) func() (*sim.Result, error) {
	tasks := fs.Int("tasks", 4, "tasks serving the customer (2-64)")
	limit := fs.Float64("limit", 2, "the customer's global hard limit, CPU-seconds per second (0.01-1000)")
	surge := fs.Float64("surge", 3, "demand during the surge, times the limit (1-100)")
	cost := fs.Duration("cost", 2*time.Millisecond, "mean CPU per request (10us-100ms)")
	refresh := fs.Duration("refresh", time.Second, "how often each task renews its lease (100ms-30s)")
	duration := fs.Duration("duration", time.Minute, "virtual length of each run (20s-10m)")
	return func() (*sim.Result, error) {
		if *tasks < 1 || *limit <= 0 || *surge <= 0 || *cost <= 0 || *refresh <= 0 || *duration <= 0 { // 0 would mean the default
			return nil, errors.New("tasks, limit, surge, cost, refresh and duration must be positive")
		}
		return sim.Throttling(sim.ThrottlingConfig{Tasks: *tasks, Limit: *limit, Surge: *surge, Cost: *cost,
			Refresh: *refresh, Duration: *duration, Seed: *seed})
	}
}

func simStackFlags(fs *flag.FlagSet, seed *uint64) func() (*sim.Result, error) {
	requests := fs.Int("requests", 10000, "user requests (1-1000000)")
	return func() (*sim.Result, error) {
		if *requests < 1 {
			return nil, errors.New("requests in [1, 1000000]")
		}
		return sim.Stack(sim.StackConfig{Requests: *requests, Seed: *seed})
	}
}

// writeOut writes r's report to dir when one was asked for.
func writeOut(dir string, r *sim.Result, stderr io.Writer) int {
	if dir == "" {
		return 0
	}
	files, err := report.WriteSim(dir, r)
	if err != nil {
		fmt.Fprintf(stderr, "triage sim %s: %v\n", r.Scenario, err)
		return 1
	}
	fmt.Fprintf(stderr, "triage sim %s: wrote %s\n", r.Scenario, strings.Join(files, ", "))
	return 0
}

// subsettingResult is the JSON of 'triage sim subsetting -json': the
// scenario and its headlines, as every scenario has them, then the detail.
type subsettingResult struct {
	Scenario    string         `json:"scenario"`
	Headlines   []sim.Headline `json:"headlines"`
	Algorithm   string         `json:"algorithm"`
	Clients     int            `json:"clients"`
	Backends    int            `json:"backends"`
	Subset      int            `json:"subset"`
	Seed        uint64         `json:"seed"`
	Connections []int          `json:"connections"`
	Min         int            `json:"min"`
	Mean        float64        `json:"mean"`
	Max         int            `json:"max"`
	MinFrac     float64        `json:"min_frac"`
	MaxFrac     float64        `json:"max_frac"`
	Churn       *float64       `json:"churn,omitempty"`
	Removed     *int           `json:"removed_backend,omitempty"`
	Elapsed     time.Duration  `json:"elapsed_ns"`
}

const maxSimSize = 10000

func runSimSubsetting(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("triage sim subsetting", flag.ContinueOnError)
	fs.SetOutput(stderr)
	clients := fs.Int("clients", 300, "client tasks (1-10000)")
	backends := fs.Int("backends", 300, "backend tasks (1-10000)")
	size := fs.Int("subset", 10, "subset size: backends per client (1-backends)")
	algorithm := fs.String("algorithm", "deterministic", "deterministic, random or ringsteady (low churn)")
	seed := fs.Uint64("seed", 1, "seed of random subsetting")
	churn := fs.Bool("churn", false, "also report churn: the fraction of clients whose subset changes when one backend (the middle one) leaves and comes back")
	asJSON := fs.Bool("json", false, "print one JSON object")
	out := fs.String("out", "", "also write result.json, the figures (SVG) and index.html, a self-contained page, to this directory")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "triage sim subsetting: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	switch {
	case *clients < 1 || *clients > maxSimSize:
		fmt.Fprintf(stderr, "triage sim subsetting: -clients must be between 1 and %d, got %d\n", maxSimSize, *clients)
		return 2
	case *backends < 1 || *backends > maxSimSize:
		fmt.Fprintf(stderr, "triage sim subsetting: -backends must be between 1 and %d, got %d\n", maxSimSize, *backends)
		return 2
	case *size < 1 || *size > *backends:
		fmt.Fprintf(stderr, "triage sim subsetting: -subset must be between 1 and -backends (%d), got %d\n", *backends, *size)
		return 2
	case *churn && *backends < 2:
		fmt.Fprintln(stderr, "triage sim subsetting: -churn needs at least 2 backends")
		return 2
	}
	alg, err := subset.ByName(*algorithm, *seed)
	if err != nil {
		fmt.Fprintf(stderr, "triage sim subsetting: %v\n", err)
		return 2
	}
	began := time.Now()
	conns := subset.Connections(alg, *clients, *backends, *size)
	total := 0
	for _, c := range conns {
		total += c
	}
	r := subsettingResult{
		Algorithm: alg.Name(), Clients: *clients, Backends: *backends, Subset: *size, Seed: *seed,
		Connections: conns, Min: slices.Min(conns), Max: slices.Max(conns), Mean: float64(total) / float64(len(conns)),
	}
	if r.Mean > 0 {
		r.MinFrac, r.MaxFrac = float64(r.Min)/r.Mean, float64(r.Max)/r.Mean
	}
	if *churn {
		gone := *backends / 2
		c := subset.Churn(alg, *clients, *backends, *size, gone)
		r.Churn, r.Removed = &c, &gone
	}
	r.Scenario, r.Headlines = "subsetting", subsettingHeadlines(r)
	r.Elapsed = time.Since(began)
	if code := writeOut(*out, subsettingReport(r), stderr); code != 0 {
		return code
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(r); err != nil {
			fmt.Fprintf(stderr, "triage sim subsetting: %v\n", err)
			return 1
		}
		return 0
	}
	printSubsetting(stdout, r)
	return 0
}

// subsettingHeadlines are the least and most loaded backends' connections
// as fractions of the mean, next to the book's figures where the book ran
// the same case (300 clients, 300 backends): Figure 20-5 (deterministic,
// 10), 20-3 (random, 30%: 63% and 121%), 20-4 (random, 10%: 50% and
// 150%); and the churn when asked.
func subsettingHeadlines(r subsettingResult) []sim.Headline {
	lo := sim.Headline{Name: "least loaded backend, fraction of the mean", Value: r.MinFrac}
	hi := sim.Headline{Name: "most loaded backend, fraction of the mean", Value: r.MaxFrac}
	if r.Clients == 300 && r.Backends == 300 {
		var figure string
		var l, h float64
		switch {
		case r.Algorithm == "deterministic" && r.Subset == 10:
			figure, l, h = "Figure 20-5", 1, 1
		case r.Algorithm == "random" && r.Subset == 90:
			figure, l, h = "Figure 20-3", 0.63, 1.21
		case r.Algorithm == "random" && r.Subset == 30:
			figure, l, h = "Figure 20-4", 0.50, 1.50
		}
		if figure != "" {
			lo.Book, lo.Note = &l, "book: "+figure
			hi.Book, hi.Note = &h, "book: "+figure
		}
	}
	hs := []sim.Headline{lo, hi}
	if r.Churn != nil {
		hs = append(hs, sim.Headline{Name: "churn, share of clients whose subset changes", Value: *r.Churn,
			Note: fmt.Sprintf("when backend %d leaves; the least possible is subset/backends = %.4f", *r.Removed, float64(r.Subset)/float64(r.Backends))})
	}
	return hs
}

// subsettingReport is r as a sim.Result for the report: its headlines, a
// table of the histogram, and the histogram as a figure (Figures 20-3 to
// 20-5 plot the same).
func subsettingReport(r subsettingResult) *sim.Result {
	counts, hist := histogram(r.Connections)
	res := &sim.Result{Scenario: "subsetting", Seed: r.Seed, Headlines: r.Headlines, Elapsed: r.Elapsed,
		Table: [][]string{{"connections", "backends"}}}
	se := sim.Series{Name: fmt.Sprintf("%s, subset %d", r.Algorithm, r.Subset)}
	for _, c := range counts {
		res.Table = append(res.Table, []string{fmt.Sprint(c), fmt.Sprint(hist[c])})
		se.X = append(se.X, float64(c))
		se.Y = append(se.Y, float64(hist[c]))
	}
	res.Plots = []sim.Plot{{Name: "connections", Title: fmt.Sprintf("connections per backend: %d clients, %d backends", r.Clients, r.Backends),
		XLabel: "connections", YLabel: "backends", Series: []sim.Series{se}}}
	return res
}

// histogram counts how many backends have each connection count, and
// returns the counts present in order.
func histogram(conns []int) ([]int, map[int]int) {
	hist := map[int]int{}
	for _, c := range conns {
		hist[c]++
	}
	counts := make([]int, 0, len(hist))
	for c := range hist {
		counts = append(counts, c)
	}
	slices.Sort(counts)
	return counts, hist
}

func printSubsetting(w io.Writer, r subsettingResult) {
	hr := sim.Result{Scenario: r.Scenario, Seed: r.Seed, Headlines: r.Headlines, Elapsed: r.Elapsed}
	hr.WriteText(w)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%s subsetting: %d clients, %d backends, subset %d\n", r.Algorithm, r.Clients, r.Backends, r.Subset)
	fmt.Fprintf(w, "connections per backend: min %d (%.0f%% of the mean), mean %.1f, max %d (%.0f%% of the mean)\n",
		r.Min, 100*r.MinFrac, r.Mean, r.Max, 100*r.MaxFrac)
	// A histogram: how many backends have each connection count.
	counts, hist := histogram(r.Connections)
	most := 0
	for _, n := range hist {
		most = max(most, n)
	}
	fmt.Fprintln(w, "connections  backends  fraction of the mean")
	for _, c := range counts {
		bar := strings.Repeat("#", max(1, hist[c]*50/most))
		frac := 0.0
		if r.Mean > 0 {
			frac = float64(c) / r.Mean
		}
		fmt.Fprintf(w, "%11d  %8d  %5.2f %s\n", c, hist[c], frac, bar)
	}
	if r.Churn != nil {
		fmt.Fprintf(w, "churn: %.1f%% of clients change subset when backend %d leaves (and again when it returns)\n", 100**r.Churn, *r.Removed)
	}
}
