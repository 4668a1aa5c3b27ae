package admission

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/criticality"
)

// MaxForceShed bounds a ForceShed drill's length: a drill forgotten by its
// operator ends on its own.
const MaxForceShed = time.Hour

// forcedShed is one level's drill: the fraction to reject (float64 bits)
// until a time (ns on the Controller's clock).
type forcedShed struct {
	fraction atomic.Uint64
	until    atomic.Int64
}

// ForceShed rejects, for d, the fraction f of the requests of level l at
// arrival, with reason Forced, as if the task were shedding them (the CRE
// post: "thoroughly test your logic"): a game-day drill that shows whether
// the clients above back off, retry elsewhere and degrade as they should.
// It is for operators to wire to their own admin surface; triageprom
// reports the drills in effect (Stats.Forced). A later call for the same
// level replaces the drill; f 0 or d 0 ends it. f must be in [0, 1] and d
// in [0, MaxForceShed]. The drill adds two atomic loads per request while
// any drill has been set.
func (c *Controller) ForceShed(l criticality.Level, f float64, d time.Duration) error {
	switch {
	case !l.Valid():
		return fmt.Errorf("%w: force-shed: invalid criticality %d", ErrConfig, l)
	case !(f >= 0 && f <= 1):
		return fmt.Errorf("%w: force-shed: fraction must be in [0, 1], got %v", ErrConfig, f)
	case d < 0 || d > MaxForceShed:
		return fmt.Errorf("%w: force-shed: duration must be in [0, %v], got %v", ErrConfig, MaxForceShed, d)
	}
	fs := &c.drills[l]
	if f == 0 || d == 0 {
		fs.until.Store(0)
		return nil
	}
	fs.until.Store(0)
	fs.fraction.Store(math.Float64bits(f))
	fs.until.Store(c.now() + int64(d))
	c.forcedAny.Store(true)
	return nil
}

// forced returns level l's drill in effect at now: the fraction rejected
// (0: none).
func (c *Controller) forced(l criticality.Level, now int64) float64 {
	fs := &c.drills[l]
	if now >= fs.until.Load() {
		return 0
	}
	return math.Float64frombits(fs.fraction.Load())
}

// forcedOut reports whether the drill rejects this request of level l.
func (c *Controller) forcedOut(l criticality.Level, now int64) bool {
	f := c.forced(l, now)
	return f > 0 && (f >= 1 || c.random() < f)
}
