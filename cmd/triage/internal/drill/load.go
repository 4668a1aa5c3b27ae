package drill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/triagehq/triage/loadtest"
	"github.com/triagehq/triage/wire"
)

// load is the open-loop load generator: users who do not slow down when
// the service does.
type load struct {
	url    string
	res    *RunResult
	client *http.Client
}

// requestTimeout is how long a user waits for an answer.
const requestTimeout = 2 * time.Second

func newLoad(url string, r *RunResult) *load {
	return &load{url: url, res: r, client: &http.Client{
		Timeout:   requestTimeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: 1024, IdleConnTimeout: 5 * time.Second},
	}}
}

// run sends the classes' traffic until end, at the load (a multiple of
// the provisioned rate, at most peakLoad) that load gives for the time
// since start, on the open loop of loadtest.OpenLoop: every 10 ms, each
// class's requests due in it. Each request runs in its own goroutine (at
// most the peak rate times the timeout). It returns when every request
// has an answer.
func (lg *load) run(ctx context.Context, start time.Time, load func(time.Duration) float64, end time.Duration) {
	const tick = 10 * time.Millisecond
	acc := make([]float64, len(classes))
	var due []int // the classes of the current tick's requests, in order
	var t time.Duration
	base := time.Until(start) // the schedule's time at start
	next := func(int) (time.Duration, bool) {
		for len(due) == 0 {
			t += tick
			el := t - base
			if el >= end {
				return t, false
			}
			x := min(max(load(el), 1), peakLoad)
			for i, c := range classes {
				acc[i] += c.rate(x) * tick.Seconds()
				for ; acc[i] >= 1; acc[i]-- {
					due = append(due, i)
				}
			}
		}
		return t, true
	}
	loadtest.OpenLoop{}.Run(ctx, next, func(int, time.Duration) func() {
		c := classes[due[0]]
		due = due[1:]
		return lg.send(ctx, c, start)
	})
}

// send returns the call of one request of class c.
func (lg *load) send(ctx context.Context, c class, start time.Time) func() {
	sent := time.Now()
	el := sent.Sub(start)
	record := el >= 0 // not during the warm-up
	if record {
		lg.res.sent(el, c.level)
	}
	return func() {
		if !record {
			lg.unrecorded(ctx, c)
			return
		}
		answered := false
		answer := func(ok, degraded bool, reason string) {
			if answered {
				lg.res.answeredTwice()
				return
			}
			answered = true
			lg.res.answered(el, c.level, ok, degraded, reason, time.Since(sent))
		}
		defer func() {
			if !answered {
				answer(false, false, "no answer recorded")
			}
		}()
		req, err := http.NewRequestWithContext(ctx, "GET", lg.url+c.path, nil)
		if err != nil {
			answer(false, false, "request not built")
			return
		}
		req.Header.Set("X-Api-Key", c.key)
		resp, err := lg.client.Do(req)
		if err != nil {
			reason := "connection failed"
			if errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "Timeout") {
				reason = "user gave up (2 s)"
			}
			answer(false, false, reason)
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			answer(true, resp.Header.Get("X-Degraded") == "1", "")
			return
		}
		reason := resp.Header.Get(wire.OutcomeHeader)
		if reason == "" {
			reason = fmt.Sprintf("HTTP %d", resp.StatusCode)
		}
		answer(false, false, reason)
	}
}

// unrecorded sends one request of the warm-up.
func (lg *load) unrecorded(ctx context.Context, c class) {
	req, err := http.NewRequestWithContext(ctx, "GET", lg.url+c.path, nil)
	if err != nil {
		return
	}
	req.Header.Set("X-Api-Key", c.key)
	if resp, err := lg.client.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

func (lg *load) close() { lg.client.CloseIdleConnections() }

// view is the live view: a status block redrawn every second on a
// terminal (one line a second otherwise), and the same as a web page.
type view struct {
	mu     sync.Mutex
	out    io.Writer
	tty    bool
	lines  int // lines of the block on screen
	block  string
	events []string
}

func newView(out io.Writer, quiet bool) *view {
	v := &view{out: out}
	if f, ok := out.(*os.File); ok && !quiet {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			v.tty = true
		}
	}
	return v
}

func (v *view) printf(format string, a ...any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := fmt.Sprintf(format, a...)
	if len(v.events) >= 200 {
		v.events = v.events[1:]
	}
	v.events = append(v.events, strings.TrimRight(s, "\n"))
	if v.tty && v.lines > 0 {
		fmt.Fprintf(v.out, "\033[%dA\033[J", v.lines)
	}
	fmt.Fprint(v.out, s)
	if v.tty && v.block != "" {
		fmt.Fprint(v.out, v.block)
	}
}

// show draws the run's last complete second.
func (v *view) show(r *RunResult, phase string, el, total time.Duration) {
	r.mu.Lock()
	i := int(el/time.Second) - 2 // answers to requests sent 2 s ago are in
	var s Second
	if i >= 0 && i < len(r.Seconds) {
		s = r.Seconds[i]
		s.Rejected = copyMap(s.Rejected)
	}
	var util map[string]float64
	if j := int(el/time.Second) - 1; j >= 0 && j < len(r.Seconds) {
		util = copyMap(r.Seconds[j].Util)
	}
	died := r.TasksDied
	r.mu.Unlock()

	var b strings.Builder
	done := min(1, el.Seconds()/total.Seconds())
	bar := strings.Repeat("#", int(done*30)) + strings.Repeat(".", 30-int(done*30))
	fmt.Fprintf(&b, "[%s] %-14s %5.1fs  run %q  task deaths %d\n", bar, phase, el.Seconds(), r.Name, died)
	fmt.Fprintf(&b, "  answered (sent 2 s ago):")
	for l := 3; l >= 0; l-- {
		fmt.Fprintf(&b, "  %s %d/%d", []string{"S", "SP", "C", "CP"}[l], s.OK[l], s.Sent[l])
	}
	fmt.Fprintf(&b, "  degraded %d\n  rejected:", s.Degraded)
	if len(s.Rejected) == 0 {
		b.WriteString(" none")
	}
	for _, k := range sortedKeys(s.Rejected) {
		fmt.Fprintf(&b, "  %s %d", k, s.Rejected[k])
	}
	b.WriteString("\n  utilization:")
	for _, k := range sortedKeys(util) {
		if strings.HasPrefix(k, "frontend") {
			continue
		}
		fmt.Fprintf(&b, " %s %3.0f%%", k, 100*util[k])
	}
	b.WriteString("\n")
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.tty {
		if v.lines > 0 {
			fmt.Fprintf(v.out, "\033[%dA\033[J", v.lines)
		}
		fmt.Fprint(v.out, b.String())
		v.lines = strings.Count(b.String(), "\n")
	} else {
		fmt.Fprint(v.out, strings.ReplaceAll(strings.TrimRight(b.String(), "\n"), "\n  ", " |"), "\n")
	}
	v.block = b.String()
}

// serve serves the live view on addr: a page that reloads the view every
// second.
func (v *view) serve(addr string) (func(), error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/view.txt", func(w http.ResponseWriter, _ *http.Request) {
		v.mu.Lock()
		text := v.block + "\n" + strings.Join(v.events[max(0, len(v.events)-30):], "\n")
		v.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, text)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, livePage)
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ln, err := listen(addr)
	if err != nil {
		return nil, err
	}
	go srv.Serve(ln)
	return func() { srv.Close() }, nil
}

const livePage = `<!doctype html><meta charset="utf-8"><title>triage drill</title>
<style>body{font-family:sans-serif;margin:2em}pre{font-size:14px;background:#f6f6f6;padding:1em}</style>
<h1>triage overload drill, live</h1><pre id="v">waiting…</pre>
<script>
async function tick(){try{const r=await fetch('/view.txt');document.getElementById('v').textContent=await r.text()}catch(e){}}
tick();setInterval(tick,1000);
</script>`

func copyMap[V any](m map[string]V) map[string]V {
	out := make(map[string]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
