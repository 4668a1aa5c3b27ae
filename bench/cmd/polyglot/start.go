package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// start runs argv pinned to the server's CPU, with its output in
// out/name.log, waits until port answers, and returns a func that stops
// it.
func (c config) start(ctx context.Context, out, name string, port int, argv ...string) (func(), error) {
	return c.startOn(ctx, c.serverCPU, out, name, port, argv...)
}

// startOn is start on cpu.
func (c config) startOn(ctx context.Context, cpu, out, name string, port int, argv ...string) (func(), error) {
	stop, _, err := c.startGroup(ctx, cpu, out, name, port, argv...)
	return stop, err
}

// startGroup is startOn that also returns the process group the command
// runs in (its CPU: child.GroupCPU).
func (c config) startGroup(ctx context.Context, cpu, out, name string, port int, argv ...string) (func(), int, error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, 0, err
	}
	// The port must be free: a process left from another run that still
	// answers on it would pass the wait below and be measured instead.
	// The last run's, killed, may hold it a moment longer (gunicorn's
	// workers die after their master).
	if err := portFree(port, portFreeWait); err != nil {
		return nil, 0, fmt.Errorf("starting %s: %w", name, err)
	}
	logf, err := os.Create(filepath.Join(out, name+".log"))
	if err != nil {
		return nil, 0, err
	}
	cmd := exec.CommandContext(ctx, "taskset", append([]string{"-c", cpu}, argv...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, 0, err
	}
	stop := func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
		logf.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			conn.Close()
			return stop, cmd.Process.Pid, nil
		}
		if time.Now().After(deadline) {
			stop()
			b, _ := os.ReadFile(logf.Name())
			return nil, 0, fmt.Errorf("%s did not listen on %d: %s", name, port, b)
		}
	}
}

// portFreeWait is how long startGroup waits for a port to stop answering.
const portFreeWait = 3 * time.Second

// portFree waits up to wait for nothing to answer on port on loopback.
func portFree(port int, wait time.Duration) error {
	for deadline := time.Now().Add(wait); ; time.Sleep(50 * time.Millisecond) {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return nil
		}
		conn.Close()
		if time.Now().After(deadline) {
			return fmt.Errorf("port %d on loopback still answers after %v (a process left from another run?)", port, wait)
		}
	}
}
