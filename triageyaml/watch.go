package triageyaml

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/trust"
)

// Watcher reloads a configuration file without a restart: a quota policy
// (WatchQuota), an isolation table (WatchIsolation) or an edge
// configuration (WatchEdge). Every interval
// (default 1 s) it reads the file and, when its bytes changed, parses and
// validates it (ParseQuota, ParseIsolation, ParseEdge) and puts it in force.
// A file that fails to read or validate is refused and counted; the policy
// in force stays, and the same bad bytes are not reported twice. So a bad
// push never takes a task down (Google Cloud's June 2025 outage began with
// one).
//
// Run is its only goroutine and stops when its context is done. It holds
// one copy of the file (at most MaxSize bytes).
type Watcher struct {
	path     string
	load     func([]byte) (apply func(), err error)
	clock    clock.Clock
	interval time.Duration

	mu       sync.Mutex
	last     []byte // the bytes last seen, good or bad
	reloads  int
	refusals int
	lastErr  error
}

// QuotaWatcher is the Watcher of a quota policy file.
type QuotaWatcher = Watcher

// WatchOption configures a Watcher.
type WatchOption interface{ apply(*Watcher) }

type watchOptionFunc func(*Watcher)

func (f watchOptionFunc) apply(c *Watcher) { f(c) }

// WithWatchInterval sets how often the file is read. Default 1 s.
func WithWatchInterval(d time.Duration) WatchOption {
	return watchOptionFunc(func(w *Watcher) { w.interval = d })
}

// WithWatchClock sets the clock. Default clock.Real().
func WithWatchClock(c clock.Clock) WatchOption {
	return watchOptionFunc(func(w *Watcher) { w.clock = c })
}

// WatchQuota loads the policy at path, hands it to apply, and returns a
// watcher that reloads it; an initial file that does not load is an
// error.
func WatchQuota(path string, apply func(*quota.Policy), opts ...WatchOption) (*QuotaWatcher, error) {
	if apply == nil {
		return nil, errors.New("triageyaml: WatchQuota needs an apply func")
	}
	return watch(path, func(b []byte) (func(), error) {
		p, err := ParseQuota(b)
		return func() { apply(p) }, err
	}, opts)
}

// WatchIsolation loads the isolation config at path (ParseIsolation),
// puts it in force in t, and returns a watcher that reloads it: this is
// how an operator moves a client type to the sacrificial backends, or
// black-holes it, without a restart. An initial file that does not load
// is an error; a later bad file is refused and t keeps what it had.
func WatchIsolation(path string, t *isolate.Table, opts ...WatchOption) (*Watcher, error) {
	if t == nil {
		return nil, errors.New("triageyaml: WatchIsolation needs a Table")
	}
	return watch(path, func(b []byte) (func(), error) {
		c, err := ParseIsolation(b)
		if err == nil {
			err = t.Set(c)
		}
		return func() {}, err
	}, opts)
}

// WatchEdge loads the edge configuration at path (ParseEdge), puts it in
// force in pol and cl (Edge.Build's, or any others: trust.Policy.Update,
// edge.Classifier.Update), and returns a watcher that reloads it: trusted
// networks and identities, the default and the rules change for the next
// request, without a restart. An initial file that does not load is an
// error; a later bad file is refused, with the line and column of the
// part that is wrong, and pol and cl keep what they had.
func WatchEdge(path string, pol *trust.Policy, cl *edge.Classifier, opts ...WatchOption) (*Watcher, error) {
	if pol == nil || cl == nil {
		return nil, errors.New("triageyaml: WatchEdge needs a trust.Policy and an edge.Classifier")
	}
	return watch(path, func(b []byte) (func(), error) {
		e, err := ParseEdge(b)
		return func() {
			// ParseEdge built both: neither update can fail.
			_ = pol.Update(e.Trust)
			_ = cl.Update(e.Criticality)
		}, err
	}, opts)
}

func watch(path string, load func([]byte) (func(), error), opts []WatchOption) (*Watcher, error) {
	w := &Watcher{path: path, load: load, interval: time.Second}
	for _, o := range opts {
		o.apply(w)
	}
	if w.interval <= 0 {
		return nil, errors.New("triageyaml: the watch interval must be positive")
	}
	w.clock = clock.OrReal(w.clock)
	if _, err := w.Check(); err != nil {
		return nil, err
	}
	return w, nil
}

// Check reads the file now and applies it if it changed and is valid. It
// reports whether a new policy was applied.
func (w *Watcher) Check() (bool, error) {
	b, err := readBounded(w.path)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil && w.last != nil && bytes.Equal(b, w.last) {
		return false, nil
	}
	var apply func()
	if err == nil {
		w.last = b
		if apply, err = w.load(b); err != nil {
			err = fmt.Errorf("%s: %w", w.path, err)
		}
	}
	if err != nil {
		w.refusals++
		w.lastErr = err
		return false, err
	}
	w.reloads++
	w.lastErr = nil
	apply()
	return true, nil
}

// Stats returns how many policies were applied and refused, and the error
// of the last refused one if it is still the latest word.
func (w *Watcher) Stats() (reloads, refusals int, lastErr error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reloads, w.refusals, w.lastErr
}

// Run checks the file every interval until ctx is done; errors are kept
// for Stats and passed to onErr if not nil.
func (w *Watcher) Run(ctx context.Context, onErr func(error)) error {
	t := w.clock.NewTimer(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C():
		}
		if _, err := w.Check(); err != nil && onErr != nil {
			onErr(err)
		}
		t.Reset(w.interval)
	}
}
