// Package lifecycle models a backend task's serving state, the SRE book's
// lame duck (ch. 20, "A Robust Approach to Unhealthy Tasks: Lame Duck
// State"): a task in lame duck still serves everything that reaches it,
// but asks its clients to send new requests elsewhere. Shutdown is the
// book's clean shutdown: enter lame duck, keep serving for the drain
// interval, then stop the server.
//
// The transport adapters announce the state: triagegrpc through gRPC
// health checking and a triage-lame-duck trailer, triagehttp through its
// health handler, a Triage-Lame-Duck header and closing idle keep-alive
// connections. Both subscribe to a Lifecycle with Subscribe.
//
// The zero value is not usable; call New. A Lifecycle is safe for
// concurrent use. It holds one flag and the subscribers' callbacks (one
// per adapter that announces the state).
package lifecycle

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
)

// DefaultDrain is how long Shutdown serves in lame duck before it stops
// the server: the book gives "between 10s and 150s depending on client
// complexity".
const DefaultDrain = 30 * time.Second

// Lifecycle is a task's serving state. Create one with New.
type Lifecycle struct {
	drain time.Duration
	clock clock.Clock
	lame  atomic.Bool

	mu   sync.Mutex // orders state changes and their announcements
	subs map[int]func(lameDuck bool)
	next int
}

// Option configures a Lifecycle.
type Option interface{ apply(*Lifecycle) }

type optionFunc func(*Lifecycle)

func (f optionFunc) apply(l *Lifecycle) { f(l) }

// WithDrain sets how long Shutdown serves in lame duck before it stops the
// server. Default DefaultDrain.
func WithDrain(d time.Duration) Option { return optionFunc(func(l *Lifecycle) { l.drain = d }) }

// WithWarmup starts the task in lame duck: clients connect but send
// nothing until Ready.
func WithWarmup() Option { return optionFunc(func(l *Lifecycle) { l.lame.Store(true) }) }

// WithClock sets the clock of the drain interval. Default clock.Real().
func WithClock(c clock.Clock) Option { return optionFunc(func(l *Lifecycle) { l.clock = c }) }

// New returns a Lifecycle, serving unless WithWarmup.
func New(opts ...Option) (*Lifecycle, error) {
	l := &Lifecycle{drain: DefaultDrain, subs: map[int]func(bool){}}
	for _, o := range opts {
		o.apply(l)
	}
	if l.drain < 0 {
		return nil, errors.New("lifecycle: negative drain interval")
	}
	l.clock = clock.OrReal(l.clock)
	return l, nil
}

// InLameDuck reports whether the task is in lame duck.
func (l *Lifecycle) InLameDuck() bool { return l.lame.Load() }

// Ready announces that the task serves.
func (l *Lifecycle) Ready() { l.set(false) }

// EnterLameDuck asks every client to send new requests elsewhere. The task
// keeps serving.
func (l *Lifecycle) EnterLameDuck() { l.set(true) }

func (l *Lifecycle) set(lame bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lame.Store(lame)
	for _, f := range l.subs {
		f(lame)
	}
}

// Subscribe calls f with the current state at once, then with every
// change, in order, until unsubscribe is called. f runs with the
// Lifecycle's lock held: it must be quick and must not call back into the
// Lifecycle.
func (l *Lifecycle) Subscribe(f func(lameDuck bool)) (unsubscribe func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := l.next
	l.next++
	l.subs[id] = f
	f(l.lame.Load())
	return func() {
		l.mu.Lock()
		delete(l.subs, id)
		l.mu.Unlock()
	}
}

// Shutdown enters lame duck, serves on for the drain interval, then calls
// stop, which stops the server gracefully (requests in flight finish) and
// must return when its context ends, stopping hard. ctx bounds the whole:
// when it ends, the drain is cut short and stop is given the ended
// context. Shutdown returns ctx's error if it ended, else stop's.
func (l *Lifecycle) Shutdown(ctx context.Context, stop func(context.Context) error) error {
	l.EnterLameDuck()
	t := l.clock.NewTimer(l.drain)
	defer t.Stop()
	select {
	case <-t.C():
	case <-ctx.Done():
	}
	err := stop(ctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
