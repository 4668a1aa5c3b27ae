package subset

import (
	"math/rand/v2"
	"slices"
	"time"
)

// Defaults.
const (
	// DefaultSize is the subset size when none is configured: the low end
	// of the book's "a subset size of 20 to 100 backend tasks".
	DefaultSize = 20
	// DefaultReplaceAfter is how long a member must have been failing
	// before a Keeper brings in a replacement.
	DefaultReplaceAfter = time.Second
	// forgetAfter is how long a Keeper remembers that a backend it no
	// longer watches was failing (a replacement that failed in turn):
	// after it, the backend may be chosen again.
	forgetAfter = 30 * time.Second
)

// Keeper keeps one client's subset whole through failures (SRE book
// ch. 20: "when a backend task becomes unavailable, its clients may need
// to temporarily pick a replacement backend", with as little churn as
// possible). The members are the algorithm's subset plus, for each member
// failing for at least ReplaceAfter or announced as leaving (Leaving),
// one replacement; the failed member
// stays a member, so that its connection shows when it is back, and its
// replacement leaves then. Replacements come from the backends outside
// the subset in an order of the client's own (a permutation seeded by the
// client's number), so the clients of a failed backend spread its load
// over the others, and each client's choice is stable: one connection
// added when a member fails, one removed when it returns.
//
// The zero value is not usable; call NewKeeper. A Keeper is not safe for
// concurrent use. Its memory is O(backends): it remembers failing
// backends only among those it was given.
type Keeper struct {
	alg    Algorithm
	client int
	size   int
	after  time.Duration

	base   []string // the algorithm's subset, in the backends' order
	inBase map[string]bool
	order  []string // the other backends, in the client's order
	down   map[string]time.Time
}

// NewKeeper returns a Keeper of client's subset of the given size, chosen
// by alg, with replacements after replaceAfter (<= 0: DefaultReplaceAfter).
func NewKeeper(alg Algorithm, client, size int, replaceAfter time.Duration) *Keeper {
	if replaceAfter <= 0 {
		replaceAfter = DefaultReplaceAfter
	}
	return &Keeper{alg: alg, client: client, size: size, after: replaceAfter, inBase: map[string]bool{}, down: map[string]time.Time{}}
}

// SetBackends sets every backend, by id, in an order every client shares
// (sorted addresses, or the scheduler's task numbers). What the Keeper
// knows of failing backends that remain is kept.
func (k *Keeper) SetBackends(ids []string) {
	idx := all(len(ids))
	if k.size > 0 && k.size < len(ids) {
		idx = k.alg.Subset(len(ids), k.client, k.size)
	}
	k.base = Of(ids, idx)
	clear(k.inBase)
	for _, id := range k.base {
		k.inBase[id] = true
	}
	k.order = k.order[:0]
	for _, id := range ids {
		if !k.inBase[id] {
			k.order = append(k.order, id)
		}
	}
	r := rand.New(rand.NewPCG(uint64(k.client), 0x7265706c61636521))
	for i := len(k.order) - 1; i > 0; i-- {
		j := int(r.Uint64N(uint64(i + 1)))
		k.order[i], k.order[j] = k.order[j], k.order[i]
	}
	if len(k.down) > 0 {
		known := make(map[string]bool, len(ids))
		for _, id := range ids {
			known[id] = true
		}
		for id := range k.down {
			if !known[id] {
				delete(k.down, id)
			}
		}
	}
}

// Report records a member's state: failing (its connection failed or its
// health check says not serving) or serving again.
func (k *Keeper) Report(id string, failing bool, now time.Time) {
	if !failing {
		delete(k.down, id)
		return
	}
	if _, ok := k.down[id]; !ok {
		k.down[id] = now
	}
}

// Leaving records that a member announced it is leaving (lame duck: a
// drain before a restart). Its replacement is due at once, not after
// ReplaceAfter: an announced departure is not a flap to wait out, and
// meanwhile its share would fall on the rest of the subset. Report(id,
// false) ends it, as it ends a failure.
func (k *Keeper) Leaving(id string, now time.Time) {
	due := now.Add(-k.after)
	if since, ok := k.down[id]; !ok || since.After(due) {
		k.down[id] = due
	}
}

// Members returns the backends to connect to now, subset first, then the
// replacements in the order they were chosen, and how long until a
// failing member's replacement falls due (0: none pending).
func (k *Keeper) Members(now time.Time) (members []string, next time.Duration) {
	failed := func(id string) bool {
		since, ok := k.down[id]
		if ok {
			if left := k.after - now.Sub(since); left > 0 {
				if next == 0 || left < next {
					next = left
				}
				return false
			}
		}
		return ok
	}
	members = append(members, k.base...)
	need := 0
	for _, id := range k.base {
		if failed(id) {
			need++
		}
	}
	for _, id := range k.order {
		if need == 0 {
			break
		}
		if failed(id) {
			continue
		}
		members = append(members, id)
		need--
	}
	for id, since := range k.down {
		if !slices.Contains(members, id) && now.Sub(since) >= forgetAfter {
			delete(k.down, id)
		}
	}
	return members, next
}
