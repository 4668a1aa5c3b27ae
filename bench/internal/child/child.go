// Package child starts the benchmarks' server processes: this binary again
// with a sub-command, GOMAXPROCS=1, pinned to a CPU with taskset when
// there is one, announcing "LISTEN ADDR [ADMIN]" on its first line; runs a load
// process of its own at the lowest priority (RunLow) and pins this one
// (PinSelf); and reads a process's CPU use from /proc.
package child

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// Process is a started server process.
type Process struct {
	Addr  string
	Admin string // the LISTEN line's second address, if it has one
	Pid   int
	cmd   *exec.Cmd
	work  atomic.Pointer[work] // the last "WORK CALLS NANOS" line the process printed
}

// work is one WORK line's figures, read together.
type work struct{ calls, nanos int64 }

// Start runs this binary with args, one CPU (cpu: a taskset list; empty:
// not pinned), and waits for its "LISTEN ADDR [ADMIN]" line.
func Start(cpu string, args ...string) (*Process, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	argv := append([]string{exe}, args...)
	if cpu != "" {
		if ts, err := exec.LookPath("taskset"); err == nil {
			argv = append([]string{ts, "-c", cpu}, argv...)
		}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{Pid: cmd.Process.Pid, cmd: cmd}
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) < 2 || len(f) > 3 || f[0] != "LISTEN" {
		p.Stop()
		return nil, fmt.Errorf("%s did not start: %q %v", args[0], line, err)
	}
	go p.readWork(r)
	p.Addr = f[1]
	if len(f) == 3 {
		p.Admin = f[2]
	}
	return p, nil
}

// readWork reads the process's stdout after its LISTEN line until it
// closes, keeping the last WORK line's figures.
func (p *Process) readWork(r *bufio.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var w work
		if n, _ := fmt.Sscanf(sc.Text(), "WORK %d %d", &w.calls, &w.nanos); n == 2 {
			p.work.Store(&w)
		}
	}
	io.Copy(io.Discard, r) // a line too long for the scanner: drain the rest
}

// Work returns what the process last reported on a "WORK CALLS NANOS" line
// of its stdout (a server's handlers' calls finished and the nanoseconds
// spent in them, as stockclient's server reports them with -report-work),
// or 0, 0.
func (p *Process) Work() (calls, nanos int64) {
	if w := p.work.Load(); w != nil {
		return w.calls, w.nanos
	}
	return 0, 0
}

// Stop kills the process and waits for it.
func (p *Process) Stop() {
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

// Running reports whether the process is still running: not exited, nor
// a zombie waiting for Stop.
func (p *Process) Running() bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// CPU returns the CPU seconds (user + system) the process used so far.
func (p *Process) CPU() float64 { return ProcessCPU(p.Pid) }

// ProcessCPU returns the CPU seconds process pid used so far, from /proc
// (0 where there is none).
func ProcessCPU(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100 // clock ticks (USER_HZ is 100 on Linux)
}

// GroupCPU returns the CPU seconds the processes of process group pgid
// (a server and the workers it forked: nginx, gunicorn) used so far, from
// /proc; processes that ended are not counted.
func GroupCPU(pgid int) float64 {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	total := 0.0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 || f[2] != strconv.Itoa(pgid) {
			continue
		}
		total += ProcessCPU(pid)
	}
	return total
}

// PinSelf pins this process, every thread of it, to cpu (a taskset list)
// when cpu is not empty and taskset exists.
func PinSelf(cpu string) {
	if cpu == "" {
		return
	}
	if ts, err := exec.LookPath("taskset"); err == nil {
		exec.Command(ts, "-a", "-pc", cpu, strconv.Itoa(os.Getpid())).Run()
	}
}

// RunLow runs this binary with args at the lowest priority (nice 19, when
// there is nice) on cpu (when not empty), waits for it, and decodes its
// standard output, one JSON value, into v.
func RunLow(cpu string, v any, args ...string) error {
	return RunLowUntil(context.Background(), cpu, v, args...)
}

// RunLowUntil is RunLow that, when ctx ends, asks the process to finish
// (SIGTERM) and still decodes what it prints.
func RunLowUntil(ctx context.Context, cpu string, v any, args ...string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	argv := append([]string{exe}, args...)
	if cpu != "" {
		if ts, err := exec.LookPath("taskset"); err == nil {
			argv = append([]string{ts, "-c", cpu}, argv...)
		}
	}
	if nice, err := exec.LookPath("nice"); err == nil {
		argv = append([]string{nice, "-n", "19"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			cmd.Process.Signal(syscall.SIGTERM)
		case <-done:
		}
	}()
	err = cmd.Wait()
	close(done)
	if err != nil {
		return err
	}
	return json.Unmarshal(out.Bytes(), v)
}

// Counts parses a sub-command's arguments as non-negative integers.
func Counts(args []string) ([]int64, error) {
	nums := make([]int64, len(args))
	for i, a := range args {
		v, err := strconv.ParseInt(a, 10, 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("bad argument %q", a)
		}
		nums[i] = v
	}
	return nums, nil
}
