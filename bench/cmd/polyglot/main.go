// Command polyglot measures triage sidecar in front of services not
// written in Go (bench/polyglot: Python's ThreadingHTTPServer and Node's
// http module, each request burning a calibrated amount of CPU), against
// the same upstream unprotected and behind the stock proxies users would
// pick instead (nginx with limit_conn and limit_req, HAProxy with maxconn,
// a queue and priority classes from the criticality header).
//
// The upstream and the proxy in front of it share one core (-server-cpu),
// as a sidecar shares its pod's CPU; triage loadtest runs alone on the
// other (-load-cpu). The -own-cpu configurations put the proxy on the
// load generator's core instead: the proxy's CPU is then not the
// upstream's (the generator's is shared). The python-stack upstream is
// two Python tiers, the front calling the leaf, unprotected or each
// behind its own sidecar (the front calling through its -egress). For every run the upstream is started afresh; before
// each load step its capacity C is probed directly (this machine's CPU
// speed drifts), then the step offers that multiple of C through the
// configuration, with the criticality mix and a deadline. Runs of the
// configurations are interleaved, -repeats times, and the table gives
// medians.
//
//	cd bench && go run ./cmd/polyglot -out /tmp/polyglot
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"slices"

	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/triagehq/triage/bench/internal/child"
	"github.com/triagehq/triage/bench/internal/stockproxy"
	"github.com/triagehq/triage/bench/internal/triagebin"
	"github.com/triagehq/triage/criticality"
	measuring "github.com/triagehq/triage/internal/measure"
	"github.com/triagehq/triage/loadtest"
)

type config struct {
	upstreams, proxies, loads []string
	repeats                   int
	step                      time.Duration
	serverCPU, loadCPU        string
	pyRounds, nodeRounds      int
	ioMS                      int
	sidecarArgs               []string
	out, triage, dir          string
}

func main() {
	var c config
	var ups, pxs, loads string
	flag.StringVar(&ups, "upstreams", "python,node", "upstreams: python, node, node-grpc (a gRPC service in Node, @grpc/grpc-js: npm ci in bench/polyglot), node-load (node reporting its event loop utilization in ORCA's header), gunicorn (sync workers, CPU then I/O wait), python-stack (two Python tiers, the front calling the leaf; with the configurations direct and sidecar)")
	flag.StringVar(&pxs, "proxies", "direct,nginx,haproxy,sidecar",
		"configurations: direct (unprotected), nginx, haproxy, sidecar, sidecar-gradient (-limit-rule gradient), sidecar-noload (-upstream-load=false); NAME-own-cpu: the proxy on -load-cpu instead of the upstream's")
	flag.StringVar(&loads, "loads", "0.5,1,2,5,10", "load steps, multiples of the upstream's probed capacity")
	flag.IntVar(&c.repeats, "repeats", 3, "runs of each configuration (interleaved); the table gives medians")
	flag.DurationVar(&c.step, "step", 5*time.Second, "length of each load step")
	flag.StringVar(&c.serverCPU, "server-cpu", "0", "CPU of the upstream and its proxy")
	flag.StringVar(&c.loadCPU, "load-cpu", "1", "CPU of triage loadtest")
	flag.IntVar(&c.pyRounds, "python-rounds", 30000, "sha256 rounds per Python request (about 10 ms here, a typical Python handler)")
	flag.IntVar(&c.nodeRounds, "node-rounds", 40000, "PBKDF2-HMAC-SHA256 iterations per Node request (about 8 ms here)")
	flag.IntVar(&c.ioMS, "io-ms", 20, "the gunicorn upstream's I/O wait per request, ms (after a sixth of -python-rounds of CPU)")
	flag.StringVar(&c.out, "out", "polyglot-out", "directory for every run's result.json and the table")
	flag.Func("sidecar-arg", "a flag for triage sidecar beyond its defaults (-trust 127.0.0.1/32, -metrics), e.g. -sidecar-arg=-tolerance=2; repeatable", func(v string) error {
		c.sidecarArgs = append(c.sidecarArgs, v)
		return nil
	})
	soak := flag.Duration("soak", 0, "instead of the table: run the first of -upstreams behind the sidecar at 10x C for this long, reading the sidecar's goroutines and memory every 10 s")
	over := flag.Duration("overhead", 0, "instead of the table: measure the sidecar's added latency at 0.5x C for this long per run (requests at random direct or through the sidecar)")
	flag.Parse()
	c.upstreams, c.proxies, c.loads = strings.Split(ups, ","), strings.Split(pxs, ","), strings.Split(loads, ",")
	if (*soak > 0 || *over > 0) && slices.Contains(c.upstreams, "node-grpc") {
		log.Fatal("-soak and -overhead send HTTP requests: they do not take the node-grpc upstream")
	}
	if *soak > 0 {
		if err := c.prepare(); err != nil {
			log.Fatal(err)
		}
		if err := c.runSoak(c.upstreams[0], *soak); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *over > 0 {
		if err := c.prepare(); err != nil {
			log.Fatal(err)
		}
		if err := c.runOverhead(*over); err != nil {
			log.Fatal(err)
		}
		return
	}
	if err := runTable(c); err != nil {
		log.Fatal(err)
	}
}

// prepare makes the output directory, builds triage into it and finds
// the upstreams' sources.
func (c *config) prepare() error {
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return err
	}
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/triagehq/triage").Output()
	if err != nil {
		return fmt.Errorf("finding the triage module: %v", err)
	}
	if c.triage, err = triagebin.Build(c.out); err != nil {
		return err
	}
	c.dir = filepath.Join(strings.TrimSpace(string(root)), "bench", "polyglot")
	if slices.Contains(c.upstreams, "node-grpc") {
		if _, err := os.Stat(filepath.Join(c.dir, "node_modules", "@grpc", "grpc-js")); err != nil {
			return fmt.Errorf("the node-grpc upstream needs @grpc/grpc-js: run npm ci in %s", c.dir)
		}
	}
	return nil
}

func runTable(c config) error {
	if err := c.prepare(); err != nil {
		return err
	}
	results := map[string][]*run{} // upstream/proxy
	for _, up := range c.upstreams {
		for rep := 1; rep <= c.repeats; rep++ {
			for _, px := range c.proxies {
				name := fmt.Sprintf("%s-%s-%d", up, px, rep)
				r, err := c.once(up, px, filepath.Join(c.out, name))
				if err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				results[up+"/"+px] = append(results[up+"/"+px], r)
				fmt.Printf("%s: C %.0f/s, goodput %s\n", name, r.Capacity, goodputs(r))
			}
		}
	}
	table := c.table(results)
	fmt.Print(table)
	return os.WriteFile(filepath.Join(c.out, "table.md"), []byte(table), 0o644)
}

// run is one configuration's steps, and which of them a change of the
// machine's speed disturbed.
type run struct {
	*loadtest.Result
	disturbed []bool
	proxyCPU  []float64 // the proxy's CPU in each step, in cores
	// upMSPerOK is the upstream's CPU per success in each step, in ms:
	// equal behind two fronts, a gap in their goodput is the fronts' own
	// CPU on the shared core (or a queue's), not work the upstream did
	// for nobody.
	upMSPerOK []float64
}

func goodputs(r *run) string {
	var s []string
	for i, st := range r.Steps {
		s = append(s, fmt.Sprintf("%gx %.2f", st.Load, st.Goodput))
		if i < len(r.proxyCPU) {
			s[i] += fmt.Sprintf(" (proxy CPU %.0f%%)", 100*r.proxyCPU[i])
		}
		if i < len(r.upMSPerOK) && r.upMSPerOK[i] > 0 {
			s[i] += fmt.Sprintf(" (upstream %.1f ms CPU a success)", r.upMSPerOK[i])
		}
		if r.disturbed[i] {
			s[i] += " (disturbed)"
		}
	}
	return strings.Join(s, ", ")
}

// Ports of one run, all on loopback.
const (
	upstreamPort = 18000
	proxyPort    = 18080
	metricsPort  = 18090
)

// once starts the upstream and the proxy in front of it, and offers each
// load through the proxy at the upstream's capacity probed just before.
func (c config) once(up, px, out string) (*run, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if up == "python-stack" {
		return c.stack(ctx, px, out)
	}
	stopUp, upGroup, err := c.startGroup(ctx, c.serverCPU, out, "upstream", upstreamPort, c.upstreamArgv(up)...)
	if err != nil {
		return nil, err
	}
	defer stopUp()
	upURL := targetURL(up, upstreamPort)
	target := upURL
	proxyGroup := 0 // the proxy's process group, for its CPU
	if px != "direct" {
		probe, err := c.probe(ctx, filepath.Join(out, "probe"), upURL)
		if err != nil {
			return nil, err
		}
		name, cpu := px, c.serverCPU
		if base, ok := strings.CutSuffix(px, "-own-cpu"); ok {
			name, cpu = base, c.loadCPU // the proxy on a CPU of its own (shared with the load generator)
		}
		argv, err := c.proxyArgv(up, name, out, probe)
		if err != nil {
			return nil, err
		}
		stopPx, pgid, err := c.startGroup(ctx, cpu, out, name, proxyPort, argv...)
		if err != nil {
			return nil, err
		}
		defer stopPx()
		proxyGroup = pgid
		target = targetURL(up, proxyPort)
	}
	// Each step: the upstream's capacity probed directly, then the step
	// offered through the configuration at that capacity.
	all := &run{Result: &loadtest.Result{}}
	var caps []float64
	speed := c.canary()
	for _, l := range c.loads {
		capacity, err := c.probe(ctx, filepath.Join(out, "probe-"+l), upURL)
		if err != nil && len(caps) == 0 {
			return nil, err
		}
		if err != nil {
			// An unprotected upstream still working off the last step's
			// backlog: the step runs at the last capacity probed.
			fmt.Printf("  %s before %sx: %v; using C = %.0f\n", out, l, err, caps[len(caps)-1])
			capacity = caps[len(caps)-1]
		}
		cpu0, up0 := child.GroupCPU(proxyGroup), child.GroupCPU(upGroup)
		r, err := c.loadtest(ctx, filepath.Join(out, "step-"+l), append(targetFlags(target), "-capacity", strconv.FormatFloat(capacity, 'f', 1, 64),
			"-loads", l, "-step", c.step.String())...)
		if err != nil {
			return nil, err
		}
		if proxyGroup != 0 {
			// The proxy's CPU over the load test's run (which starts and
			// ends a little around the step), as a share of a core.
			all.proxyCPU = append(all.proxyCPU, (child.GroupCPU(proxyGroup)-cpu0)/c.step.Seconds())
		}
		all.upMSPerOK = append(all.upMSPerOK, msPerSuccess(child.GroupCPU(upGroup)-up0, r.Steps[0]))
		after := c.canary()
		all.Steps = append(all.Steps, r.Steps...)
		all.disturbed = append(all.disturbed, disturbed(r.Steps[0], speed, after))
		speed = after
		caps = append(caps, capacity)
	}
	all.Capacity = measuring.Median(caps)
	return all, nil
}

// msPerSuccess is cpu seconds spent over st, in ms per success (0
// without one). The CPU is read around the load test's whole run, which
// starts and ends a little around the step, as the proxy's is.
func msPerSuccess(cpu float64, st loadtest.Step) float64 {
	ok := 0
	for _, l := range st.Levels {
		ok += l.OK
	}
	if ok == 0 {
		return 0
	}
	return 1000 * cpu / float64(ok)
}

// canary times a fixed amount of CPU work (the upstream's: sha256 rounds
// in Python) on the load's CPU, idle between steps: this machine's speed
// drifts (a virtual machine's), by half at times. Median of three, in
// seconds.
func (c config) canary() float64 {
	var ts []float64
	for range 3 {
		b, err := exec.Command("taskset", "-c", c.loadCPU, "python3", "-c",
			"import hashlib,time\nt=time.perf_counter()\nh=b'x'\nfor _ in range(100000): h=hashlib.sha256(h).digest()\nprint(time.perf_counter()-t)").Output()
		if err != nil {
			return 0
		}
		v, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		ts = append(ts, v)
	}
	return measuring.Median(ts)
}

// disturbed says a step's measurement does not stand: the machine's
// speed changed by over 15% between before and after it, or over 1% of
// its calls were sent more than 10 ms late (the load generator was
// behind).
func disturbed(st loadtest.Step, before, after float64) bool {
	if before <= 0 || after <= 0 || after/before > 1.15 || before/after > 1.15 {
		return true
	}
	return st.LateSends*100 > st.Scheduled
}

// probe returns the capacity triage loadtest's closed-loop probe finds at
// url, trying for up to 20 s while url sustains no rate at all.
func (c config) probe(ctx context.Context, out, url string) (float64, error) {
	var err error
	for try := 0; try < 5; try++ {
		if try > 0 {
			time.Sleep(4 * time.Second)
		}
		var r *loadtest.Result
		if r, err = c.loadtest(ctx, out, append(targetFlags(url), "-loads", "0.1", "-step", "1s")...); err == nil {
			return r.Capacity, nil
		}
	}
	return 0, fmt.Errorf("probing %s: it sustained no rate for 20 s", url)
}

// grpcMethod is the node-grpc upstream's method (bench/polyglot/grpc-upstream.js).
const grpcMethod = "/bench.Burn/Call"

// targetURL is where the load goes for upstream up on port: an HTTP URL,
// or for a gRPC upstream grpc://host:port followed by its method.
func targetURL(up string, port int) string {
	if up == "node-grpc" {
		return fmt.Sprintf("grpc://127.0.0.1:%d%s", port, grpcMethod)
	}
	return fmt.Sprintf("http://127.0.0.1:%d/", port)
}

// targetFlags are triage loadtest's flags for a targetURL.
func targetFlags(u string) []string {
	if rest, ok := strings.CutPrefix(u, "grpc://"); ok {
		addr, method, _ := strings.Cut(rest, "/")
		return []string{"-grpc", addr, "-method", "/" + method}
	}
	return []string{"-url", u}
}

// Ports of the stack's second tier, its sidecar, and the first tier's
// egress listener.
const (
	leafPort        = 18001
	leafSidecarPort = 18081
	egressPort      = 18070
)

// stack runs the two-tier Python stack: a front tier (a quarter of
// -python-rounds, then one call to the leaf) and a leaf tier (all of
// them). Unprotected, the front calls the leaf directly; with triage,
// each tier is behind its own sidecar and the front calls the leaf
// through its sidecar's -egress. C is probed on the unprotected stack.
func (c config) stack(ctx context.Context, px, out string) (*run, error) {
	py := func(port, rounds int, down string) []string {
		return []string{"python3", filepath.Join(c.dir, "upstream.py"), strconv.Itoa(port), strconv.Itoa(rounds), down}
	}
	leafURL := fmt.Sprintf("http://127.0.0.1:%d/", leafPort)
	stopLeaf, err := c.start(ctx, out, "leaf", leafPort, py(leafPort, c.pyRounds, "")[:4]...)
	if err != nil {
		return nil, err
	}
	defer stopLeaf()
	stopFront, err := c.start(ctx, out, "front", upstreamPort, py(upstreamPort, c.pyRounds/4, leafURL)...)
	if err != nil {
		return nil, err
	}
	frontURL := fmt.Sprintf("http://127.0.0.1:%d/", upstreamPort)
	capacity, err := c.probe(ctx, filepath.Join(out, "probe"), frontURL)
	if err != nil {
		stopFront()
		return nil, err
	}
	target := frontURL
	if px == "sidecar" {
		stopFront()
		egress := fmt.Sprintf("127.0.0.1:%d", egressPort)
		if stopFront, err = c.start(ctx, out, "front", upstreamPort, py(upstreamPort, c.pyRounds/4, "http://"+egress+"/")...); err != nil {
			return nil, err
		}
		for _, s := range []struct {
			name     string
			port, to int
			extra    []string
		}{{"leaf-sidecar", leafSidecarPort, leafPort, nil},
			{"sidecar", proxyPort, upstreamPort, []string{"-egress", fmt.Sprintf("%s=http://127.0.0.1:%d", egress, leafSidecarPort)}}} {
			argv := append([]string{c.triage, "sidecar", "-upstream", fmt.Sprintf("http://127.0.0.1:%d", s.to),
				"-listen", fmt.Sprintf("127.0.0.1:%d", s.port), "-trust", "127.0.0.1/32"}, s.extra...)
			stop, err := c.start(ctx, out, s.name, s.port, argv...)
			if err != nil {
				stopFront()
				return nil, err
			}
			defer stop()
		}
		target = fmt.Sprintf("http://127.0.0.1:%d/", proxyPort)
	}
	defer stopFront()
	all := &run{Result: &loadtest.Result{Capacity: capacity}}
	speed := c.canary()
	for _, l := range c.loads {
		r, err := c.loadtest(ctx, filepath.Join(out, "step-"+l), "-url", target, "-capacity", strconv.FormatFloat(capacity, 'f', 1, 64),
			"-loads", l, "-step", c.step.String())
		if err != nil {
			return nil, err
		}
		after := c.canary()
		all.Steps = append(all.Steps, r.Steps...)
		all.disturbed = append(all.disturbed, disturbed(r.Steps[0], speed, after))
		speed = after
	}
	return all, nil
}

func (c config) upstreamArgv(up string) []string {
	port := strconv.Itoa(upstreamPort)
	switch up {
	case "node":
		return []string{"node", filepath.Join(c.dir, "upstream.js"), port, strconv.Itoa(c.nodeRounds)}
	case "node-load": // the same, reporting its event loop's utilization (ORCA)
		return []string{"env", "LOAD_REPORT=1", "node", filepath.Join(c.dir, "upstream.js"), port, strconv.Itoa(c.nodeRounds)}
	case "node-grpc":
		return []string{"node", filepath.Join(c.dir, "grpc-upstream.js"), port, strconv.Itoa(c.nodeRounds)}
	case "gunicorn":
		return []string{"env", fmt.Sprintf("ROUNDS=%d", c.pyRounds/6), fmt.Sprintf("IO_MS=%d", c.ioMS),
			"gunicorn", "--workers", strconv.Itoa(gunicornWorkers), "--bind", "127.0.0.1:" + port, "--chdir", c.dir, "wsgi:app"}
	}
	return []string{"python3", filepath.Join(c.dir, "upstream.py"), port, strconv.Itoa(c.pyRounds)}
}

// gunicornWorkers is the gunicorn upstream's sync workers: gunicorn's
// documented (2 x cores) + 1 for the one core it has.
const gunicornWorkers = 3

// maxconn is HAProxy's maxconn for the upstream, as its documentation
// says: the requests it serves at once. A one-core threaded server is
// kept busy by two (one working, one arriving); gunicorn's sync workers
// serve one each.
func maxconn(up string) int {
	if up == "gunicorn" {
		return gunicornWorkers
	}
	return 2
}

// loadtest runs triage loadtest pinned to the load's CPU and reads its
// result.json.
func (c config) loadtest(ctx context.Context, out string, args ...string) (*loadtest.Result, error) {
	argv := append([]string{"-c", c.loadCPU, c.triage, "loadtest", "-out", out, "-max-duration", "5m"}, args...)
	cmd := exec.CommandContext(ctx, "taskset", argv...)
	b, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("loadtest: %v\n%s", err, b)
	}
	os.WriteFile(filepath.Join(out, "loadtest.txt"), b, 0o644)
	rb, err := os.ReadFile(filepath.Join(out, "result.json"))
	if err != nil {
		return nil, err
	}
	var r loadtest.Result
	return &r, json.Unmarshal(rb, &r)
}

// proxyArgv writes the proxy's configuration (if it has one) into out
// and returns its command line.
func (c config) proxyArgv(up, px, out string, capacity float64) ([]string, error) {
	addr := fmt.Sprintf("127.0.0.1:%d", upstreamPort)
	listen := fmt.Sprintf("127.0.0.1:%d", proxyPort)
	switch px {
	case "sidecar", "sidecar-gradient", "sidecar-noload":
		scheme := "http://"
		if up == "node-grpc" {
			scheme = "h2c://"
		}
		argv := append([]string{c.triage, "sidecar", "-upstream", scheme + addr, "-listen", listen, "-trust", "127.0.0.1/32",
			"-metrics", fmt.Sprintf("127.0.0.1:%d", metricsPort)}, c.sidecarArgs...)
		switch px {
		case "sidecar-gradient": // the other limit rule, to compare on the same runs
			argv = append(argv, "-limit-rule", "gradient")
		case "sidecar-noload": // the upstream's load reports ignored
			argv = append(argv, "-upstream-load=false")
		}
		return argv, nil
	case "nginx", "haproxy":
		// nginx: limit_req at the measured capacity with a burst of a
		// tenth of a second, limit_conn at the concurrency that keeps a
		// one-core upstream busy. HAProxy: maxconn as its documentation
		// says for the upstream, the rest queued for at most half the
		// callers' deadline (a longer wait serves callers who gave up).
		return stockproxy.Argv(px, stockproxy.Config{Upstream: addr, Listen: listen, Dir: out,
			Rate: int(capacity + 0.5), Burst: max(int(capacity/10), 1), Conns: 4,
			Maxconn: maxconn(up), Queue: 500 * time.Millisecond, GRPC: up == "node-grpc"})
	}
	return nil, fmt.Errorf("unknown configuration %q", px)
}

// table is the medians of every configuration's runs, per load.
func (c config) table(results map[string][]*run) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Medians of %d runs, less the disturbed ones (the machine's speed changed over 15%% across the step, or the load generator fell behind); each cell: goodput (successes/s / C); CRITICAL_PLUS and CRITICAL answered; p50 / p99 ms of every success; CRITICAL's own p50 / p99 ms.\n\n", c.repeats)
	fmt.Fprintf(&b, "| upstream | in front | C/s | %s |\n|---|---|---|%s\n", strings.Join(loadHeads(c.loads), " | "), strings.Repeat("---|", len(c.loads)))
	for _, up := range c.upstreams {
		for _, px := range c.proxies {
			rs := results[up+"/"+px]
			var caps []float64
			for _, r := range rs {
				caps = append(caps, r.Capacity)
			}
			fmt.Fprintf(&b, "| %s | %s | %.0f |", up, px, measuring.Median(caps))
			for i := range c.loads {
				fmt.Fprintf(&b, " %s |", cell(rs, i))
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

func loadHeads(loads []string) []string {
	var out []string
	for _, l := range loads {
		out = append(out, l+"x")
	}
	return out
}

// cell is step i's medians over runs.
func cell(rs []*run, i int) string {
	var g, cp, cr, p50, p99, c50, c99 []float64
	discarded := 0
	for _, r := range rs {
		if i >= len(r.Steps) {
			continue
		}
		if r.disturbed[i] {
			discarded++
			continue
		}
		st := r.Steps[i]
		g = append(g, st.Goodput)
		for _, lv := range st.Levels {
			switch lv.Level {
			case criticality.CriticalPlus:
				cp = append(cp, lv.Success)
			case criticality.Critical:
				cr = append(cr, lv.Success)
				c50 = append(c50, lv.Latency.P50)
				c99 = append(c99, lv.Latency.P99)
			}
		}
		p50 = append(p50, st.Latency.P50)
		p99 = append(p99, st.Latency.P99)
	}
	if len(g) == 0 {
		return fmt.Sprintf("all %d runs disturbed", discarded)
	}
	mark := ""
	if discarded > 0 {
		mark = fmt.Sprintf(" (of %d; %d disturbed)", len(g), discarded)
	}
	return fmt.Sprintf("%.2f; %.0f/%.0f%%; %.1f / %.0f; CRITICAL %.1f / %.0f%s", measuring.Median(g), 100*measuring.Median(cp), 100*measuring.Median(cr),
		measuring.Median(p50), measuring.Median(p99), measuring.Median(c50), measuring.Median(c99), mark)
}
