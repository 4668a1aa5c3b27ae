// Package connload treats connections as load, SRE book ch. 21, "Load
// from Connections": "the overhead of maintaining a large pool of
// connections" costs CPU and memory at both ends, and "a large batch job
// that creates a very large number of client tasks all at once" can
// overload backends through connections alone.
//
// A Listener wraps a task's net.Listener. It counts the open connections
// (busy or idle), the recent rate of new ones and of health checks, offers the open count as a utilization
// signal (it satisfies signals.Signal), and bounds both: new connections
// are accepted at most at a rate (a token bucket) and never beyond a
// maximum open. A connection it does not accept yet waits in the kernel's
// accept queue, as it would behind a busy task, instead of being set up at
// once: a thousand clients arriving in the same second are taken in over
// several, and the requests the task is already serving keep their CPU.
// (Clients that give up reconnect with jittered exponential backoff: gRPC's
// and triagegrpc's clients do.)
//
// It uses only the standard library; gRPC servers use it as the listener
// they Serve, net/http servers likewise. By default it wraps each
// connection to see it close. A server that reports its connections'
// ends itself calls Track instead, and gets the bare connections: gRPC-Go
// reads a bare *net.TCPConn without pinning a buffer per idle connection,
// and a wrapper would cost it that (grpc-go's transport only reads that
// way from the net package's own connection types).
// triagegrpc.WithConnLoad does so from gRPC's connection events.
package connload

import (
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
)

// Defaults.
const (
	// DefaultAcceptRate is how many new connections a second a task sets
	// up: a gRPC-Go server spends on the order of 100 µs of CPU on each
	// (accept, HTTP/2 settings, its goroutines and buffers), so 200 a
	// second cost about 2% of a core, however many arrive.
	DefaultAcceptRate = 200
	// DefaultAcceptBurst is how many may be set up at once after a quiet
	// spell: a client pool's reconnection after a restart.
	DefaultAcceptBurst = 50
	// DefaultMaxOpen bounds the open connections: at about 70 KB each for
	// gRPC-Go's buffers and goroutines, 10,000 hold some 700 MB.
	DefaultMaxOpen = 10000
	// rateWindow is the window of the new-connection rate.
	rateWindow = 10 * time.Second
)

// Observer is told of the Listener's events, for metrics. Methods must be
// cheap and safe for concurrent use.
type Observer interface {
	// Accepted: a connection was set up after waiting d for the bounds
	// (0 when it did not wait).
	Accepted(d time.Duration)
	// Closed: a connection ended.
	Closed()
}

// Nop is an Observer that does nothing.
type Nop struct{}

func (Nop) Accepted(time.Duration) {}
func (Nop) Closed()                {}

// Option configures a Listener.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	rate    float64
	burst   int
	maxOpen int
	clock   clock.Clock
	obs     Observer
}

// WithAcceptRate sets the new connections accepted per second and the
// burst. Defaults DefaultAcceptRate and DefaultAcceptBurst. A rate of 0
// (with any burst) removes the rate bound.
func WithAcceptRate(perSecond float64, burst int) Option {
	return optionFunc(func(c *config) { c.rate, c.burst = perSecond, burst })
}

// WithMaxOpen bounds the open connections. Default DefaultMaxOpen; 0
// removes the bound.
func WithMaxOpen(n int) Option { return optionFunc(func(c *config) { c.maxOpen = n }) }

// WithClock sets the clock. Default clock.Real().
func WithClock(c clock.Clock) Option { return optionFunc(func(cfg *config) { cfg.clock = c }) }

// WithObserver sets the Observer. Default Nop.
func WithObserver(o Observer) Option { return optionFunc(func(c *config) { c.obs = o }) }

// Listener is a net.Listener whose connections are counted and bounded.
// It is safe for concurrent use. Its memory is fixed: counters, and one
// wrapper (or, tracked, one Conn handle) per open connection (at most MaxOpen).
type Listener struct {
	net.Listener
	cfg   config
	start time.Time

	mu       sync.Mutex // guards tokens, last, and the rate rings
	tokens   float64
	last     time.Time
	accepts  secRing // accepts per second of the last rateWindow
	checks   secRing // health checks likewise
	freed    chan struct{}
	closed   chan struct{}
	once     sync.Once
	open     atomic.Int64
	busy     atomic.Int64
	tracked  atomic.Bool
	accepted atomic.Int64
	delayed  atomic.Int64
	waiting  atomic.Int64 // Accept calls waiting for room at MaxOpen
	health   atomic.Int64
}

// secRing counts events per second over the last rateWindow.
type secRing struct {
	n  [10]int64
	at int64 // the second n's newest slot counts
}

// add counts one event in second sec.
func (r *secRing) add(sec int64) {
	r.advance(sec)
	r.n[sec%int64(len(r.n))]++
}

// advance clears the seconds between the newest and sec.
func (r *secRing) advance(sec int64) {
	for s := max(r.at+1, sec-int64(len(r.n))+1); s <= sec; s++ {
		r.n[s%int64(len(r.n))] = 0
	}
	r.at = max(r.at, sec)
}

// sum is the events in the window ending with second sec.
func (r *secRing) sum(sec int64) int64 {
	r.advance(sec)
	var n int64
	for _, c := range r.n {
		n += c
	}
	return n
}

// NewListener wraps l.
func NewListener(l net.Listener, opts ...Option) (*Listener, error) {
	if l == nil {
		return nil, errors.New("connload: nil listener")
	}
	c := config{rate: DefaultAcceptRate, burst: DefaultAcceptBurst, maxOpen: DefaultMaxOpen}
	for _, o := range opts {
		o.apply(&c)
	}
	switch {
	case !(c.rate >= 0) || math.IsInf(c.rate, 0) || c.rate > 1e6:
		return nil, fmt.Errorf("connload: accept rate must be in [0, 1e6] per second, got %v", c.rate)
	case c.rate > 0 && (c.burst < 1 || c.burst > 1e6):
		return nil, fmt.Errorf("connload: burst must be in [1, 1e6], got %d", c.burst)
	case c.maxOpen < 0:
		return nil, fmt.Errorf("connload: max open must be >= 0, got %d", c.maxOpen)
	}
	c.clock = clock.OrReal(c.clock)
	if c.obs == nil {
		c.obs = Nop{}
	}
	now := c.clock.Now()
	return &Listener{Listener: l, cfg: c, start: now, tokens: float64(c.burst), last: now,
		freed: make(chan struct{}, 1), closed: make(chan struct{})}, nil
}

// ErrClosed is returned by Accept once the Listener is closed.
var ErrClosed = net.ErrClosed

// Accept waits until the bounds allow one more connection, then accepts
// it from the underlying listener.
func (l *Listener) Accept() (net.Conn, error) {
	began := l.cfg.clock.Now()
	waited := false
	for l.cfg.maxOpen > 0 && l.open.Load() >= int64(l.cfg.maxOpen) {
		waited = true
		l.waiting.Add(1)
		select {
		case <-l.freed:
			l.waiting.Add(-1)
		case <-l.closed:
			l.waiting.Add(-1)
			return nil, ErrClosed
		}
	}
	if d := l.take(); d > 0 {
		waited = true
		t := l.cfg.clock.NewTimer(d)
		select {
		case <-t.C():
		case <-l.closed:
			t.Stop()
			return nil, ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepted.Add(1)
	l.count()
	var d time.Duration
	if waited {
		l.delayed.Add(1)
		d = l.cfg.clock.Now().Sub(began)
	}
	l.cfg.obs.Accepted(d)
	if l.tracked.Load() {
		return c, nil
	}
	l.open.Add(1)
	return &conn{Conn: c, l: l}, nil
}

// Track makes the caller responsible for the open count: Accept returns
// bare connections from now on, and the caller reports each connection
// set up to the Tracker (a connection whose set-up fails is never
// counted). Call it before serving.
func (l *Listener) Track() *Tracker {
	l.tracked.Store(true)
	return &Tracker{l: l}
}

// Tracker is how a server that sees its own connections' lives reports
// them to a Listener (see Track).
type Tracker struct{ l *Listener }

// Open counts a connection set up, and returns its handle.
func (t *Tracker) Open() *Conn {
	t.l.open.Add(1)
	return &Conn{l: t.l}
}

// Conn is one tracked connection: the server reports the calls it
// carries, which tell busy connections from idle ones, and its end. Its
// methods are safe for concurrent use.
type Conn struct {
	l     *Listener
	calls atomic.Int64
	ended atomic.Bool
}

// CallBegin reports a call starting on the connection. Long-lived streams
// that carry no work (a health watch) are not calls.
func (c *Conn) CallBegin() {
	if c.calls.Add(1) == 1 {
		c.l.busy.Add(1)
	}
}

// CallEnd reports the end of a call CallBegin reported.
func (c *Conn) CallEnd() {
	if c.calls.Add(-1) == 0 {
		c.l.busy.Add(-1)
	}
}

// Close reports the connection's end; later calls do nothing.
func (c *Conn) Close() {
	if !c.ended.Swap(true) {
		c.l.release()
	}
}

// HealthCheck counts one health check the server answered (a check, or a
// health watch opened): health checking is load too, and from many idle
// clients it can cost more than their requests.
func (l *Listener) HealthCheck() {
	l.health.Add(1)
	sec := int64(l.cfg.clock.Now().Sub(l.start) / time.Second)
	l.mu.Lock()
	l.checks.add(sec)
	l.mu.Unlock()
}

// release counts a connection's end and wakes an Accept waiting for room.
func (l *Listener) release() {
	l.open.Add(-1)
	l.cfg.obs.Closed()
	select {
	case l.freed <- struct{}{}:
	default:
	}
}

// take takes a token, and says how long to wait before using it (0: at
// once). Tokens may go negative: the waits queue up in order.
func (l *Listener) take() time.Duration {
	if l.cfg.rate == 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.clock.Now()
	l.tokens = min(float64(l.cfg.burst), l.tokens+now.Sub(l.last).Seconds()*l.cfg.rate)
	l.last = now
	l.tokens--
	if l.tokens >= 0 {
		return 0
	}
	return time.Duration(-l.tokens / l.cfg.rate * float64(time.Second))
}

// count adds one accept to the rate ring.
func (l *Listener) count() {
	sec := int64(l.cfg.clock.Now().Sub(l.start) / time.Second)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.accepts.add(sec)
}

// Close closes the underlying listener and ends waiting Accepts.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// Stats is a snapshot for metrics.
type Stats struct {
	// Open is the connections open now; Accepted and Delayed count those
	// accepted since the start, and those that waited for the bounds.
	Open, Accepted, Delayed int64
	// Waiting is how many Accept calls wait for a connection to close
	// (MaxOpen reached).
	Waiting int64
	// Busy is the open connections carrying a call now; the others are
	// idle. Only servers that report calls (see Track) count it.
	Busy int64
	// Rate is the new connections per second over the last ten seconds.
	Rate float64
	// HealthChecks counts the health checks answered since the start;
	// HealthCheckRate is their rate per second over the last ten seconds.
	HealthChecks    int64
	HealthCheckRate float64
}

// Stats returns a snapshot.
func (l *Listener) Stats() Stats {
	sec := int64(l.cfg.clock.Now().Sub(l.start) / time.Second)
	l.mu.Lock()
	n, h := l.accepts.sum(sec), l.checks.sum(sec)
	l.mu.Unlock()
	span := min(float64(sec+1), float64(len(l.accepts.n)))
	return Stats{Open: l.open.Load(), Accepted: l.accepted.Load(), Delayed: l.delayed.Load(), Waiting: l.waiting.Load(), Busy: l.busy.Load(),
		Rate: float64(n) / span, HealthChecks: l.health.Load(), HealthCheckRate: float64(h) / span}
}

// Name implements signals.Signal.
func (l *Listener) Name() string { return "connections" }

// Utilization implements signals.Signal: open connections over the
// maximum (0 when there is none).
func (l *Listener) Utilization() float64 {
	if l.cfg.maxOpen == 0 {
		return 0
	}
	return float64(l.open.Load()) / float64(l.cfg.maxOpen)
}

// conn gives its place back when closed, once.
type conn struct {
	net.Conn
	l    *Listener
	once sync.Once
}

func (c *conn) Close() error {
	c.once.Do(c.l.release)
	return c.Conn.Close()
}
