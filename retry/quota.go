package retry

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/reqctx"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/throttle"
)

// MaxQuotaThrottles bounds the customers a Policy keeps an out-of-quota
// throttle for; customers idle for a QuotaThrottleWindow make room, and
// beyond the bound the requests of further customers share one more.
const MaxQuotaThrottles = 256

// QuotaThrottleWindow is the history of a customer's out-of-quota
// throttle: shorter than the book's two minutes, because a soft quota
// refuses a customer only while the backend is overloaded (and says retry
// after 1 s): with two minutes of memory, a customer would stay throttled
// long after the overload ended, against work conservation.
const QuotaThrottleWindow = 10 * time.Second

// quotaThrottles is adaptive throttling per customer, for "customer out of
// quota" answers: SRE book ch. 21 introduces client-side throttling for
// exactly these ("when a client detects that a significant portion of its
// recent requests have been rejected due to 'out of quota' errors, it
// starts self-regulating"), by a client task acting for one customer. A
// client that serves many customers (a frontend, a middle tier) would
// otherwise let one customer's quota throttle every other customer's
// requests of the same criticality, so each customer's out-of-quota
// answers count against that customer's own throttle, and count as
// accepted (the backend was not overloaded) for the criticality's.
//
// A known customer's throttle is found without a lock (sync.Map); a new
// one takes the lock once. At the bound, customers idle for a whole
// QuotaThrottleWindow (whose throttles hold nothing any more) are dropped,
// at most once a second, so that a new customer gets a throttle of its
// own; only while every tracked customer is active do new ones share the
// overflow throttle.
type quotaThrottles struct {
	newThrottle func() (*throttle.Throttle, error)
	byCustomer  sync.Map // customer -> *quotaEntry
	mu          sync.Mutex
	n           int
	sweptAt     int64 // ns
	other       *throttle.Throttle
}

type quotaEntry struct {
	t    *throttle.Throttle
	last atomic.Int64 // ns of its last use, to within a second
}

func (q *quotaThrottles) get(customer string, now time.Time) *throttle.Throttle {
	ns := now.UnixNano()
	if e, ok := q.byCustomer.Load(customer); ok {
		return e.(*quotaEntry).touch(ns)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if e, ok := q.byCustomer.Load(customer); ok {
		return e.(*quotaEntry).touch(ns)
	}
	if q.n >= MaxQuotaThrottles && ns-q.sweptAt >= int64(time.Second) {
		q.sweptAt = ns
		q.byCustomer.Range(func(k, v any) bool {
			if ns-v.(*quotaEntry).last.Load() > int64(QuotaThrottleWindow) {
				q.byCustomer.Delete(k)
				q.n--
			}
			return true
		})
	}
	if q.n >= MaxQuotaThrottles {
		if q.other == nil {
			q.other, _ = q.newThrottle()
		}
		return q.other
	}
	t, err := q.newThrottle()
	if err != nil {
		return nil
	}
	e := &quotaEntry{t: t}
	e.last.Store(ns)
	q.byCustomer.Store(customer, e)
	q.n++
	return t
}

// touch records a use at ns (a store at most once a second) and returns
// the throttle.
func (e *quotaEntry) touch(ns int64) *throttle.Throttle {
	if ns-e.last.Load() >= int64(time.Second) {
		e.last.Store(ns)
	}
	return e.t
}

// customerOf is the request's customer (quota.CustomerOf).
func customerOf(ctx context.Context) string {
	c, _ := ctx.Value(reqctx.CustomerKey{}).(string)
	return c
}

// ticket is one attempt's throttle tickets: the criticality's, and the
// customer's for out-of-quota answers.
type ticket struct {
	level, customer throttle.Ticket
	hasCustomer     bool
}

// allow asks the customer's throttle (if the request has a customer) and
// the criticality's.
func (p *Policy) allow(ctx context.Context, l criticality.Level, now time.Time) (ticket, bool) {
	var tk ticket
	if p.quotas != nil {
		if c := customerOf(ctx); c != "" {
			if t := p.quotas.get(c, now); t != nil {
				var ok bool
				if tk.customer, ok = t.AllowAt(l, now); !ok {
					return tk, false
				}
				tk.hasCustomer = true
			}
		}
	}
	var ok bool
	tk.level, ok = p.throttle.AllowAt(l, now)
	return tk, ok
}

// done records the attempt's answer of kind k.
func (tk ticket) done(k outcome.Kind) {
	if tk.hasCustomer {
		tk.customer.Done(k != outcome.OutOfQuota)
		tk.level.Done(k == outcome.OutOfQuota || !k.Overload())
		return
	}
	tk.level.Done(!k.Overload())
}
