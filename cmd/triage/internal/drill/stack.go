package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one process of the stack.
type proc struct {
	name    string
	args    []string
	stats   string
	netns   bool // it runs in the stack's network namespace (stack.net)
	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current process exits
	stopped bool          // the drill stopped it: not a death
	err     error
}

// alive reports whether p's process is running.
func (p *proc) alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

type stack struct {
	o      Options
	procs  []*proc
	byName map[string]*proc
	deaths chan death
	log    *os.File
	// net, when set, puts the DB tier in a network namespace of its own
	// (the partition faults), with the quota service on the drill's side
	// of the link.
	net *netns
}

// death is a task that exited without being asked to.
type death struct {
	name string
	oom  bool // out of memory (ExitOOM), else it crashed
}

// ports hands out loopback ports for the stack: outside the kernel's
// ephemeral range (32768-60999 by default), so that no outgoing connection
// takes one while its task restarts, each checked free and never handed
// out twice.
type ports struct {
	next int
	used map[int]bool
}

func newPorts() *ports {
	return &ports{next: 20000 + int(time.Now().UnixNano()%8000), used: map[int]bool{}}
}

func (p *ports) get() (string, error) { return p.getOn("127.0.0.1") }

// getOn returns a free port on host (checked on 127.0.0.1: the drill's
// namespaces use the same range).
func (p *ports) getOn(host string) (string, error) {
	for range 4000 {
		port := p.next
		p.next++
		if p.next >= 32000 {
			p.next = 20000
		}
		if p.used[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		p.used[port] = true
		return net.JoinHostPort(host, strconv.Itoa(port)), nil
	}
	return "", errors.New("drill: no free loopback port in 20000-32000")
}

func (s *stack) start(p *proc) error {
	cmd := s.o.Command(p.args...)
	if p.netns && s.net != nil {
		cmd = inNetns(cmd, s.net)
	}
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.stopped = cmd, done, false
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		stopped := p.stopped
		p.mu.Unlock()
		close(done)
		if !stopped {
			select {
			case s.deaths <- death{name: p.name, oom: cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == ExitOOM}:
			default:
			}
		}
	}()
	return nil
}

// ready waits for p's stats endpoint (or /healthz of the quota service:
// any answer will do).
func (s *stack) ready(ctx context.Context, p *proc) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if p.stats != "" {
			if resp, err := http.Get("http://" + p.stats + "/stats"); err == nil {
				resp.Body.Close()
				return nil
			}
		} else {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
			return fmt.Errorf("%s exited at start: %v", p.name, p.err)
		case <-time.After(50 * time.Millisecond): // polling a starting process
		}
	}
	return fmt.Errorf("%s did not start within 15s", p.name)
}

// stop stops p: SIGTERM (a clean shutdown), then SIGKILL after 8 s.
func (s *stack) stop(p *proc, sig syscall.Signal) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.stopped = true
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(8 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

func (s *stack) stopAll() {
	var wg sync.WaitGroup
	for _, p := range s.procs {
		wg.Add(1)
		go func() { defer wg.Done(); s.stop(p, syscall.SIGTERM) }()
	}
	wg.Wait()
}

// build starts the stack's processes: the quota service (with triage),
// the tiers from the DB up, then the frontend, and waits for each to be
// ready. It returns the frontend's address.
func (s *stack) build(ctx context.Context, protect bool) (string, error) {
	pp := newPorts()
	quotaAddr := ""
	if protect {
		var err error
		if quotaAddr, err = s.startQuota(pp); err != nil {
			return "", err
		}
	}
	next := []string{}
	for _, t := range tiers {
		addrs, err := s.addTier(pp, t, next, protect, quotaAddr)
		if err != nil {
			return "", err
		}
		next = addrs
	}
	frontAddr, err := pp.get()
	if err != nil {
		return "", err
	}
	fstats, err := pp.get()
	if err != nil {
		return "", err
	}
	fp := &proc{name: "frontend-0", stats: fstats, args: []string{"serve", RoleFrontend, "-id", "frontend-0", "-listen", frontAddr, "-stats", fstats,
		"-slots", "64", "-work", "0s", "-protect=" + strconv.FormatBool(protect), "-shadow=" + strconv.FormatBool(s.o.inShadow), "-next", strings.Join(next, ",")}}
	s.procs, s.byName[fp.name] = append(s.procs, fp), fp
	for _, p := range s.procs {
		if p.name == "quota" {
			continue
		}
		if err := s.start(p); err != nil {
			return "", err
		}
		if err := s.ready(ctx, p); err != nil {
			return "", err
		}
	}
	return frontAddr, nil
}

// startQuota writes the quota policy and starts the quota service.
func (s *stack) startQuota(pp *ports) (string, error) {
	policy := filepath.Join(s.o.Out, "quota.yaml")
	if err := os.WriteFile(policy, []byte(quotaPolicy), 0o644); err != nil {
		return "", err
	}
	host := "127.0.0.1"
	if s.net != nil {
		host = s.net.hostIP
	}
	addr, err := pp.getOn(host)
	if err != nil {
		return "", err
	}
	args := []string{"quota-server", "-policy", policy, "-listen", addr, "-lease", "5s", "-refresh", "1s"}
	if s.net != nil {
		// On the drill's own veth pair, reachable from this machine only:
		// the tasks are the drill's, as they are on loopback.
		args = append(args, "-unauthenticated")
	}
	q := &proc{name: "quota", args: args}
	if err := s.start(q); err != nil {
		return "", err
	}
	s.procs = append(s.procs, q)
	return addr, nil
}

// addTier adds the tasks of tier t, calling next, and returns their
// addresses.
func (s *stack) addTier(pp *ports, t tierSpec, next []string, protect bool, quotaAddr string) ([]string, error) {
	var addrs []string
	for i, slots := range t.slots {
		id := fmt.Sprintf("%s-%d", t.role, i)
		host, ns := "127.0.0.1", false
		if s.net != nil && s.net.runsIn(t.role, id) {
			host, ns = s.net.nsIP, true
		}
		listen, err := pp.getOn(host)
		if err != nil {
			return nil, err
		}
		stats, err := pp.getOn(host)
		if err != nil {
			return nil, err
		}
		args := []string{"serve", t.role, "-id", id, "-index", strconv.Itoa(i), "-listen", listen, "-stats", stats,
			"-slots", strconv.Itoa(slots), "-work", t.work.String(), "-protect=" + strconv.FormatBool(protect), "-shadow=" + strconv.FormatBool(s.o.inShadow)}
		if len(next) > 0 {
			args = append(args, "-next", strings.Join(next, ","))
		}
		if t.role == RoleDB && protect {
			args = append(args, "-quota", quotaAddr)
		}
		p := &proc{name: id, args: args, stats: stats, netns: ns}
		s.procs, s.byName[id] = append(s.procs, p), p
		addrs = append(addrs, listen)
	}
	return addrs, nil
}

func (s *stack) taskNames() []string {
	var out []string
	for _, p := range s.procs {
		if p.stats != "" {
			out = append(out, p.name)
		}
	}
	return out
}

// rollingRestart restarts a tier's tasks one at a time: SIGTERM (a
// protected task enters lame duck, drains and stops), a new task on the
// same address, ready before the next one goes.
func (s *stack) rollingRestart(ctx context.Context, role string, v *view, run *RunResult, start time.Time) {
	for i := 0; ; i++ {
		p := s.byName[fmt.Sprintf("%s-%d", role, i)]
		if p == nil || ctx.Err() != nil {
			return
		}
		s.stop(p, syscall.SIGTERM)
		run.note(fmt.Sprintf("%.1fs %s stopped (SIGTERM)", time.Since(start).Seconds(), p.name))
		if err := s.start(p); err != nil {
			return
		}
		if err := s.ready(ctx, p); err != nil {
			return
		}
		run.note(fmt.Sprintf("%.1fs %s started again", time.Since(start).Seconds(), p.name))
		select {
		case <-time.After(time.Second): // let it warm up before the next one goes
		case <-ctx.Done():
			return
		}
	}
}

// poll reads every task's stats into the run's current second.
func (s *stack) poll(run *RunResult, el time.Duration) { run.sample(el, s.stats(false)) }

// stats reads every task's stats; with gc, each task collects its garbage
// first, so that its live heap is what it holds.
func (s *stack) stats(gc bool) map[string]Stats {
	var mu sync.Mutex
	var wg sync.WaitGroup
	stats := map[string]Stats{}
	client := &http.Client{Timeout: 500 * time.Millisecond}
	path := "/stats"
	if gc {
		path += "?gc=1"
	}
	for _, p := range s.procs {
		if p.stats == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get("http://" + p.stats + path)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			var st Stats
			if json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st) == nil {
				mu.Lock()
				stats[p.name] = st
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return stats
}

// MaxHold bounds how long ServeStack keeps the stack up.
const MaxHold = time.Hour

// ServeStack starts the drill's stack (with triage's protections, or without),
// calls ready with the frontend's URL, and keeps the stack up until ctx
// ends or hold passes (at most MaxHold), for a load test pointed at it
// (triage loadtest -url URL/search -header "X-Api-Key: key-gmail"). It
// then stops every process it started. The tasks' logs go to
// o.Out/tasks-stack.log.
func ServeStack(ctx context.Context, o Options, protect bool, hold time.Duration, ready func(url string)) error {
	if o.Command == nil {
		return errors.New("drill: Options.Command is required")
	}
	if hold <= 0 || hold > MaxHold {
		return fmt.Errorf("drill: hold must be between 0 and %v, got %v", MaxHold, hold)
	}
	if o.Out == "" {
		dir, err := os.MkdirTemp("", "triage-stack-")
		if err != nil {
			return err
		}
		o.Out = dir
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(o.Out, "tasks-stack.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	s := &stack{o: o, byName: map[string]*proc{}, deaths: make(chan death, 64), log: logf}
	defer s.stopAll()
	frontAddr, err := s.build(ctx, protect)
	if err != nil {
		return err
	}
	ready("http://" + frontAddr)
	t := time.NewTimer(hold)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return nil
}
