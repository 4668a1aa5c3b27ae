// Package retry implements the client side of SRE book ch. 21, "Handling
// Overload Errors" and "Deciding to Retry", around the adaptive throttle of
// package throttle ("Client-Side Throttling").
//
// A Policy runs one application request as up to three attempts:
//
//   - Every attempt first passes the client's adaptive throttle; a request
//     the throttle rejects is never sent.
//   - Only "task overloaded" is retried: it means another task will likely
//     take the request. "Overloaded; don't retry", "out of quota" and every
//     other error are returned at once (other errors can be opted in with
//     WithRetryable).
//   - At most MaxAttempts (3) attempts per request ("Implement a per-request
//     retry budget of up to three attempts").
//   - A per-client Budget allows a retry only while retries stay under 10% of
//     requests ("Implement a per-client retry budget").
//   - Between attempts the Policy waits an exponential backoff with full
//     jitter (a uniformly random time up to the exponential bound), or the
//     server's RetryAfter if longer, and never past the request's deadline.
//     A RetryAfter longer than the longest backoff (WithBackoff's max,
//     default 1 s) ends the retries: the caller gets "overloaded; don't
//     retry" with the server's RetryAfter, instead of being held.
//   - Each attempt carries its number in the request metadata
//     (attempt.NewOutgoingContext: 0, 1, 2), for the backend's histograms.
//   - When the Policy gives up on an overloaded backend (attempts used up,
//     budget refused, no time left, or throttled locally) it returns
//     "overloaded; don't retry" (outcome.DontRetry), so the layer above does
//     not retry again: "requests should only be retried at the layer
//     immediately above the layer that is rejecting them."
//
// The Policy is transport-free: the call it runs sends one attempt. The
// triagegrpc and triagehttp adapters wrap it around gRPC calls and HTTP
// round trips; each attempt goes through the transport's load balancing
// like a new request, so a retry usually lands on another task.
package retry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/shadow"
	"github.com/triagehq/triage/throttle"
)

// Defaults, from the book where it gives one.
const (
	// DefaultMaxAttempts is the book's "up to three attempts".
	DefaultMaxAttempts = attempt.MaxAttempts
	// DefaultInitialBackoff bounds the first backoff (the wait is uniform in
	// [0, bound)); each retry doubles the bound.
	DefaultInitialBackoff = 20 * time.Millisecond
	// DefaultMaxBackoff caps the bound.
	DefaultMaxBackoff = time.Second
)

// ErrConfig is wrapped by every error New and NewBudget return.
var ErrConfig = errors.New("retry: invalid config")

// Observer is told what a Policy does, per criticality. Methods must be
// cheap and safe for concurrent use. triageprom.Client implements it.
type Observer interface {
	// Requested: an application request began.
	Requested(l criticality.Level)
	// Answered: an attempt got an answer; accepted is false for an overload
	// or quota rejection (and for a deadline that passed with no answer).
	Answered(l criticality.Level, accepted bool)
	// Throttled: an attempt was rejected locally by adaptive throttling.
	Throttled(l criticality.Level)
	// Retried: a retry is about to be sent (after the backoff).
	Retried(l criticality.Level)
	// BudgetRefused: a retry was refused by the per-client budget.
	BudgetRefused(l criticality.Level)
	// Exhausted: every attempt of a request was rejected as overloaded.
	Exhausted(l criticality.Level)
}

// Nop is an Observer that does nothing.
type Nop struct{}

func (Nop) Requested(criticality.Level)      {}
func (Nop) Answered(criticality.Level, bool) {}
func (Nop) Throttled(criticality.Level)      {}
func (Nop) Retried(criticality.Level)        {}
func (Nop) BudgetRefused(criticality.Level)  {}
func (Nop) Exhausted(criticality.Level)      {}

// Option configures a Policy.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	maxAttempts      int
	ratio            float64
	budgetWindow     time.Duration
	noBudget         bool
	throttle         *throttle.Throttle
	noThrottle       bool
	initial, maxWait time.Duration
	retryable        func(error) bool
	clock            clock.Clock
	random           func() float64
	obs              Observer
	shadow           shadow.Set
	shadowObs        shadow.Observer
	tracer           Tracer
}

// WithMaxAttempts sets the attempts per request, 1 to attempt.MaxAttempts
// (1 disables retries). Default DefaultMaxAttempts.
func WithMaxAttempts(n int) Option { return optionFunc(func(c *config) { c.maxAttempts = n }) }

// WithBudget sets the per-client retry budget: retries stay under ratio (in
// (0, 1]) of requests over the trailing window w (at least 1 s). Default
// DefaultRatio over DefaultBudgetWindow.
func WithBudget(ratio float64, w time.Duration) Option {
	return optionFunc(func(c *config) { c.ratio, c.budgetWindow, c.noBudget = ratio, w, false })
}

// WithoutBudget removes the per-client budget: every overloaded request is
// tried up to the maximum attempts. Only for experiments and negative
// controls; it lets retries triple the load on a failing backend.
func WithoutBudget() Option { return optionFunc(func(c *config) { c.noBudget = true }) }

// WithThrottle sets the adaptive throttle every attempt passes. Default: a
// throttle.New with the Policy's clock and random source and the book's
// defaults. Share one Throttle per backend service among the Policies
// that call it.
func WithThrottle(t *throttle.Throttle) Option {
	return optionFunc(func(c *config) { c.throttle, c.noThrottle = t, t == nil })
}

// WithoutThrottle removes client-side throttling.
func WithoutThrottle() Option {
	return optionFunc(func(c *config) { c.throttle, c.noThrottle = nil, true })
}

// WithBackoff sets the backoff: before retry n (1, 2) the Policy waits a
// uniformly random time in [0, min(max, initial x 2^(n-1))). Zero initial
// disables the wait (simulations and tests only). Default
// DefaultInitialBackoff and DefaultMaxBackoff.
func WithBackoff(initial, max time.Duration) Option {
	return optionFunc(func(c *config) { c.initial, c.maxWait = initial, max })
}

// WithRetryable makes the Policy also retry errors that are not overload
// outcomes when f returns true for them (for example a gRPC UNAVAILABLE
// from a connection failure). The same attempt limit, budget and backoff
// apply. Default: none.
func WithRetryable(f func(error) bool) Option { return optionFunc(func(c *config) { c.retryable = f }) }

// WithClock sets the clock for backoff timers and windows. Default
// clock.Real().
func WithClock(c clock.Clock) Option { return optionFunc(func(cfg *config) { cfg.clock = c }) }

// WithRandom sets the uniform [0, 1) source for jitter and the default
// throttle. Default math/rand/v2.
func WithRandom(f func() float64) Option { return optionFunc(func(c *config) { c.random = f }) }

// WithObserver sets the Observer. Default Nop.
func WithObserver(o Observer) Option { return optionFunc(func(c *config) { c.obs = o }) }

// WithShadow puts the client's mechanisms of s in shadow (package
// shadow): shadow.Throttle and shadow.RetryBudget (others in s are for
// servers and ignored here). A request the throttle would have rejected
// locally is sent, told to o (nil: shadow.Nop) and recorded by the
// throttle as the rejection it would have been, whatever its answer, so
// that the throttle decides later requests as it would have; a retry the
// budget would have refused is made, told to o. Default: none.
func WithShadow(s shadow.Set, o shadow.Observer) Option {
	return optionFunc(func(c *config) { c.shadow, c.shadowObs = s, o })
}

// Policy runs requests with throttling, retries and budgets. It is safe for
// concurrent use; use one per client of a backend service. Its memory is
// bounded (a Budget, a Throttle, and a throttle for each of at most
// MaxQuotaThrottles customers answered "out of quota": see
// quotaThrottles); Do starts no goroutines and holds one timer while it
// backs off.
type Policy struct {
	maxAttempts      int
	budget           *Budget
	throttle         *throttle.Throttle
	initial, maxWait time.Duration
	retryable        func(error) bool
	clock            clock.Clock
	start            time.Time
	since            func() time.Duration
	random           func() float64
	obs              Observer
	quotas           *quotaThrottles // with a throttle: per customer, for out of quota
	shadow           shadow.Set      // Throttle and RetryBudget only
	shadowObs        shadow.Observer
	tracer           Tracer // nil: none
}

// now reads the clock once (monotonic only, for the real clock); the
// throttle and the budget of an attempt share the reading.
func (p *Policy) now() time.Time { return p.start.Add(p.since()) }

// New returns a Policy.
func New(opts ...Option) (*Policy, error) {
	c := config{
		maxAttempts:  DefaultMaxAttempts,
		ratio:        DefaultRatio,
		budgetWindow: DefaultBudgetWindow,
		initial:      DefaultInitialBackoff,
		maxWait:      DefaultMaxBackoff,
	}
	for _, o := range opts {
		o.apply(&c)
	}
	if c.maxAttempts < 1 || c.maxAttempts > attempt.MaxAttempts {
		return nil, fmt.Errorf("%w: max attempts must be in [1, %d], got %d", ErrConfig, attempt.MaxAttempts, c.maxAttempts)
	}
	if c.initial < 0 || c.maxWait < c.initial {
		return nil, fmt.Errorf("%w: backoff needs 0 <= initial <= max, got %v and %v", ErrConfig, c.initial, c.maxWait)
	}
	p := &Policy{
		maxAttempts: c.maxAttempts,
		initial:     c.initial,
		maxWait:     c.maxWait,
		retryable:   c.retryable,
		clock:       clock.OrReal(c.clock),
		random:      c.random,
		obs:         c.obs,
		tracer:      c.tracer,
		shadow:      c.shadow & shadow.Of(shadow.Throttle, shadow.RetryBudget),
		shadowObs:   c.shadowObs,
	}
	if p.shadowObs == nil {
		p.shadowObs = shadow.Nop{}
	}
	p.start = p.clock.Now()
	p.since = clock.SinceFunc(p.clock, p.start)
	if p.random == nil {
		p.random = rand.Float64
	}
	if p.obs == nil {
		p.obs = Nop{}
	}
	if !c.noBudget {
		if err := checkBudget(c.ratio, c.budgetWindow); err != nil {
			return nil, err
		}
		p.budget = newBudget(c.ratio, c.budgetWindow, p.clock)
	}
	switch {
	case c.noThrottle:
	case c.throttle != nil:
		p.throttle = c.throttle
	default:
		t, err := throttle.New(throttle.WithClock(p.clock), throttle.WithRandom(p.random))
		if err != nil {
			return nil, err
		}
		p.throttle = t
	}
	if p.throttle != nil {
		p.quotas = &quotaThrottles{newThrottle: func() (*throttle.Throttle, error) {
			return throttle.New(throttle.WithClock(p.clock), throttle.WithRandom(p.random),
				throttle.WithWindow(QuotaThrottleWindow), throttle.WithBuckets(40))
		}}
	}
	return p, nil
}

func checkBudget(ratio float64, w time.Duration) error {
	if !(ratio > 0 && ratio <= 1) {
		return fmt.Errorf("%w: budget ratio must be in (0, 1], got %v", ErrConfig, ratio)
	}
	if w < time.Second {
		return fmt.Errorf("%w: budget window must be at least 1s, got %v", ErrConfig, w)
	}
	return nil
}

// Throttle returns the Policy's throttle, nil if it has none.
func (p *Policy) Throttle() *throttle.Throttle { return p.throttle }

// Budget returns the Policy's budget, nil if it has none.
func (p *Policy) Budget() *Budget { return p.budget }

// Call sends one attempt. ctx carries the attempt number
// (attempt.Outgoing) and the request's criticality; the call must honour
// its cancellation.
type Call func(ctx context.Context) error

// Do runs one request of the criticality in ctx (criticality.Of) as up to
// the Policy's maximum attempts of call. It returns nil, the call's own
// error when it is not retried (any non-overload error, "overloaded; don't
// retry" or "out of quota" from the backend), the context's error if ctx
// ends during a backoff, or an *outcome.Error of kind DontRetry when the
// Policy gave up on an overloaded backend:
//
//   - Local and Reason "throttled locally": adaptive throttling rejected
//     the attempt; nothing was sent.
//   - Downstream and Reason "attempts exhausted", "retry budget exhausted"
//     or "no time left to retry": the backend rejected the last attempt as
//     task overloaded and the Policy would not try again. RetryAfter is the
//     backend's.
func (p *Policy) Do(ctx context.Context, call Call) error { return p.do(ctx, call, p.maxAttempts) }

// DoOnce runs one request as a single attempt: throttled and counted like
// Do, never retried. Adapters use it where an attempt cannot be replayed
// (streams, request bodies that cannot be read again).
func (p *Policy) DoOnce(ctx context.Context, call Call) error { return p.do(ctx, call, 1) }

func (p *Policy) do(ctx context.Context, call Call, max int) error {
	l := criticality.Of(ctx)
	p.obs.Requested(l)
	now := p.now()
	if p.budget != nil {
		p.budget.request(now.UnixNano())
	}
	var last error
	shadowed := false // a mechanism in shadow would have ended the request
	for n := 0; ; n++ {
		if n > 0 {
			if err := p.beforeRetry(ctx, l, n, last, &shadowed); err != nil {
				return err
			}
			now = p.now()
		}
		var tk ticket
		if p.throttle != nil && !shadowed {
			var ok bool
			if tk, ok = p.allow(ctx, l, now); !ok && !p.shadows(shadow.Throttle, l, &shadowed) {
				p.obs.Throttled(l)
				p.trace(ctx, Throttled, l, n, 0, nil)
				return &outcome.Error{Kind: outcome.DontRetry, Local: true, Reason: "throttled locally"}
			}
		}
		actx := ctx
		if n > 0 || attempt.Outgoing(ctx) != 0 {
			actx = attempt.NewOutgoingContext(ctx, n)
		}
		err := call(actx)
		kind := outcome.Classify(err)
		if kind == outcome.Failure && ctx.Err() != nil {
			if errors.Is(ctx.Err(), context.Canceled) {
				return err // the caller gave up: not an answer, not counted
			}
			kind = outcome.TaskOverloaded // the deadline passed with no answer
		}
		accepted := !kind.Overload()
		tk.done(kind)
		p.obs.Answered(l, accepted)
		if err == nil {
			return nil
		}
		last = err
		if !p.retriable(ctx, err) {
			return err
		}
		if n+1 >= max {
			if max > 1 {
				p.obs.Exhausted(l)
				p.trace(ctx, Exhausted, l, n, 0, err)
			}
			return giveUp(err, "attempts exhausted")
		}
	}
}

func (p *Policy) retriable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	switch outcome.Classify(err) {
	case outcome.TaskOverloaded:
		return true
	case outcome.Failure:
		return p.retryable != nil && p.retryable(err)
	}
	return false
}

// shadows reports whether m is in shadow, and if so tells the shadow
// observer of the refusal it would have made and marks the request
// (*done): under enforcement the refusal would have ended it, so its
// later attempts are neither counted nor seen by the throttle and the
// budget.
func (p *Policy) shadows(m shadow.Mechanism, l criticality.Level, done *bool) bool {
	if !p.shadow.Has(m) {
		return false
	}
	p.shadowObs.WouldRefuse(m, shadow.Reasons[m][0], l)
	*done = true
	return true
}

// beforeRetry checks the deadline and the budget, then backs off.
func (p *Policy) beforeRetry(ctx context.Context, l criticality.Level, n int, last error, shadowed *bool) error {
	wait := p.backoff(n)
	if oe, ok := outcome.As(last); ok && oe.RetryAfter > wait {
		if oe.RetryAfter > p.maxWait {
			return giveUp(last, "the server asks to wait longer than the longest backoff")
		}
		wait = oe.RetryAfter
	}
	now := p.now()
	if d, ok := ctx.Deadline(); ok && !now.Add(wait).Before(d) {
		return giveUp(last, "no time left to retry")
	}
	if p.budget != nil && !*shadowed && !p.budget.tryRetry(now.UnixNano(), l) && !p.shadows(shadow.RetryBudget, l, shadowed) {
		p.obs.BudgetRefused(l)
		p.trace(ctx, BudgetRefused, l, n, 0, last)
		return giveUp(last, "retry budget exhausted")
	}
	if wait > 0 {
		t := p.clock.NewTimer(wait)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	p.obs.Retried(l)
	p.trace(ctx, Retried, l, n, wait, last)
	return nil
}

// backoff returns the full-jitter wait before retry n (1-based).
func (p *Policy) backoff(n int) time.Duration {
	if p.initial <= 0 {
		return 0
	}
	bound := p.initial << (n - 1)
	if bound > p.maxWait || bound <= 0 {
		bound = p.maxWait
	}
	return time.Duration(p.random() * float64(bound))
}

// giveUp turns the last error into "overloaded; don't retry". A non-overload
// error retried by WithRetryable is returned unchanged.
func giveUp(last error, reason string) error {
	oe, ok := outcome.As(last)
	if !ok || !oe.Kind.Overload() {
		return last
	}
	return &outcome.Error{Kind: outcome.DontRetry, RetryAfter: oe.RetryAfter, Downstream: true, Reason: reason}
}

// Single is a request sent once whose answer arrives later, such as a
// stream: Start throttles and counts it, and Finish records the answer.
// Finish must be called exactly once per Start; Single is a plain value
// with no state of its own, so the caller guards against a second call.
type Single struct {
	p  *Policy
	l  criticality.Level
	tk ticket
}

// Start begins a request that is sent once and answered later (streams).
// It returns the local "overloaded; don't retry" error of Do when adaptive
// throttling rejects it.
func (p *Policy) Start(ctx context.Context) (Single, error) {
	l := criticality.Of(ctx)
	p.obs.Requested(l)
	now := p.now()
	if p.budget != nil {
		p.budget.request(now.UnixNano())
	}
	s := Single{p: p, l: l}
	if p.throttle != nil {
		var ok bool
		if s.tk, ok = p.allow(ctx, l, now); !ok && !p.shadows(shadow.Throttle, l, new(bool)) {
			p.obs.Throttled(l)
			p.trace(ctx, Throttled, l, 0, 0, nil)
			return Single{}, &outcome.Error{Kind: outcome.DontRetry, Local: true, Reason: "throttled locally"}
		}
	}
	return s, nil
}

// Finish records the answer of a Start-ed request: err is nil or the
// error of its first response.
func (s Single) Finish(err error) {
	if s.p == nil {
		return
	}
	kind := outcome.Classify(err)
	s.tk.done(kind)
	s.p.obs.Answered(s.l, !kind.Overload())
}

// Tee returns an Observer that tells each of obs, nil ones skipped: to
// report to two exporters at once.
func Tee(obs ...Observer) Observer {
	var out tee
	for _, o := range obs {
		if o != nil {
			out = append(out, o)
		}
	}
	return out
}

type tee []Observer

func (t tee) Requested(l criticality.Level) {
	for _, o := range t {
		o.Requested(l)
	}
}

func (t tee) Answered(l criticality.Level, accepted bool) {
	for _, o := range t {
		o.Answered(l, accepted)
	}
}

func (t tee) Throttled(l criticality.Level) {
	for _, o := range t {
		o.Throttled(l)
	}
}

func (t tee) Retried(l criticality.Level) {
	for _, o := range t {
		o.Retried(l)
	}
}

func (t tee) BudgetRefused(l criticality.Level) {
	for _, o := range t {
		o.BudgetRefused(l)
	}
}

func (t tee) Exhausted(l criticality.Level) {
	for _, o := range t {
		o.Exhausted(l)
	}
}
