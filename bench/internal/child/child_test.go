package child

import (
	"bufio"
	"os/exec"
	"strings"
	"testing"
)

func TestWorkKeepsTheLastWorkLine(t *testing.T) {
	var p Process
	if c, n := p.Work(); c != 0 || n != 0 {
		t.Fatalf("before any line: Work() = %d, %d, want 0, 0", c, n)
	}
	out := "WORK 3 3000000\nlimit 2 pending 0/8.0\nWORK 7 7100000\nWORK x y\nWORK 9\n"
	p.readWork(bufio.NewReader(strings.NewReader(out)))
	if c, n := p.Work(); c != 7 || n != 7100000 {
		t.Fatalf("Work() = %d, %d, want the last whole WORK line's 7, 7100000", c, n)
	}
}

func TestWorkDrainsALineTooLongToScan(t *testing.T) {
	var p Process
	r := strings.NewReader("WORK 1 1000\n" + strings.Repeat("x", 1<<17) + "\nWORK 2 2000\n")
	p.readWork(bufio.NewReader(r))
	if c, _ := p.Work(); c != 1 {
		t.Fatalf("Work() calls = %d, want 1 (the line before the long one; the rest is drained, not read)", c)
	}
	if r.Len() != 0 {
		t.Fatalf("%d bytes left unread: a process writing to a full pipe would block", r.Len())
	}
}

// Running tells a process that runs from one that exited and was reaped.
func TestRunningFollowsTheProcess(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep command:", err)
	}
	p := &Process{Pid: cmd.Process.Pid, cmd: cmd}
	if !p.Running() {
		t.Fatal("a sleeping process: not running")
	}
	p.Stop()
	if p.Running() {
		t.Fatal("a killed and reaped process: still running")
	}
}
