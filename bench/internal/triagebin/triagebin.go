// Package triagebin builds the triage command from the main module and
// starts it, for the benchmarks that run the real binary.
package triagebin

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Build builds ./cmd/triage of the main module (whose go.sum has the
// command's dependencies) into dir and returns the binary's path.
func Build(dir string) (string, error) {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/triagehq/triage").Output()
	if err != nil {
		return "", fmt.Errorf("finding the triage module: %v", err)
	}
	bin := filepath.Join(dir, "triage")
	build := exec.Command("go", "build", "-o", bin, "./cmd/triage")
	build.Dir = strings.TrimSpace(string(root))
	if b, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building triage: %v\n%s", err, b)
	}
	return bin, nil
}

// Process is a started triage command.
type Process struct {
	Addr string // where it said it listens
	cmd  *exec.Cmd
}

// Start runs bin with args (a serving command with -listen 127.0.0.1:0)
// and waits for the line that says where it listens.
func Start(bin string, args ...string) (*Process, error) {
	cmd := exec.Command(bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd}
	r := bufio.NewReader(out)
	for p.Addr == "" {
		line, err := r.ReadString('\n')
		if err != nil {
			p.Stop()
			return nil, fmt.Errorf("%s did not say where it listens: %v", args[0], err)
		}
		if i := strings.Index(line, "listening on "); i >= 0 {
			p.Addr = strings.Fields(line[i+len("listening on "):])[0]
		}
	}
	go io.Copy(io.Discard, r)
	return p, nil
}

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Stop kills the process and waits for it.
func (p *Process) Stop() {
	p.cmd.Process.Kill()
	p.cmd.Wait()
}
