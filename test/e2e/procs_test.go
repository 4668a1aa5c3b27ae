package e2e

import (
	"bufio"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// proc2 is a child process whose output lines are kept in order.
type proc2 struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []timedLine
	ready chan struct{}
}

type timedLine struct {
	at   time.Time
	text string
}

func startChild(t *testing.T, name string, cmd *exec.Cmd, readyPrefix string) *proc2 {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc2{cmd: cmd, ready: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			l := sc.Text()
			if strings.HasPrefix(l, readyPrefix) {
				once.Do(func() { close(p.ready) })
			}
			p.mu.Lock()
			if len(p.lines) < 100000 {
				p.lines = append(p.lines, timedLine{time.Now(), l})
			}
			p.mu.Unlock()
		}
		io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	select {
	case <-p.ready:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not ready after 30 s", name)
	}
	return p
}

func (p *proc2) snapshot() []timedLine {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]timedLine(nil), p.lines...)
}

func buildTriage(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "triage")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/triagehq/triage/cmd/triage")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("building triage: %v", err)
	}
	return bin
}

func fmtFloats(v []float64) string {
	var s []string
	for _, f := range v {
		s = append(s, strconv.FormatFloat(f, 'f', 0, 64))
	}
	return strings.Join(s, " ")
}

// lastField returns the value of name= in the last status line.
func lastField(lines []timedLine, name string) float64 {
	for i := len(lines) - 1; i >= 0; i-- {
		if v, ok := field(lines[i].text, name); ok {
			return v
		}
	}
	return math.NaN()
}

func field(line, name string) (float64, bool) {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			x, err := strconv.ParseFloat(v, 64)
			return x, err == nil
		}
	}
	return 0, false
}

// usedAt sums, over the tasks, the value of name= at time at,
// interpolated between the status lines printed around it (every 250 ms).
func usedAt(backends []*proc2, at time.Time, name string) float64 {
	var total float64
	for _, b := range backends {
		var prev timedLine
		var pv float64
		v := math.NaN()
		for _, l := range b.snapshot() {
			x, ok := field(l.text, name)
			if !ok {
				continue
			}
			if !l.at.Before(at) {
				if prev.at.IsZero() {
					v = x
				} else {
					f := float64(at.Sub(prev.at)) / float64(l.at.Sub(prev.at))
					v = pv + f*(x-pv)
				}
				break
			}
			prev, pv, v = l, x, x
		}
		total += v
	}
	return total
}
