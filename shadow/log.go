package shadow

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// DefaultLogEvery is how often Log writes a line per mechanism at most:
// once a second.
const DefaultLogEvery = time.Second

// Log is an Observer that writes sampled log lines: for each mechanism, at
// most one line per interval (DefaultLogEvery), written by the first
// would-be refusal after the interval has passed, with the would-be
// refusals since the mechanism's last line by reason and criticality
// ("shadow: would have refused", mechanism=..., then reason.LEVEL=count).
// Flush writes what is pending. It is safe for concurrent use and holds a
// fixed table of counts.
type Log struct {
	log   *slog.Logger
	every time.Duration
	clk   clock.Clock

	mu      sync.Mutex
	last    [NumMechanisms]time.Time
	pending [NumMechanisms][maxReasons][criticality.NumLevels]int64
}

const maxReasons = 6 // the most reasons of one mechanism (Reasons)

// NewLog returns a Log writing to l at most once per every per
// mechanism (0: DefaultLogEvery) on clk (nil: the real clock).
func NewLog(l *slog.Logger, every time.Duration, clk clock.Clock) *Log {
	if every <= 0 {
		every = DefaultLogEvery
	}
	return &Log{log: l, every: every, clk: clock.OrReal(clk)}
}

// WouldRefuse counts one would-be refusal and writes the mechanism's line
// if its interval has passed.
func (g *Log) WouldRefuse(m Mechanism, reason string, l criticality.Level) {
	if m >= NumMechanisms || !l.Valid() {
		return
	}
	r := reasonIndex(m, reason)
	if r < 0 {
		return
	}
	now := g.clk.Now()
	g.mu.Lock()
	g.pending[m][r][l]++
	if now.Sub(g.last[m]) < g.every {
		g.mu.Unlock()
		return
	}
	g.last[m] = now
	attrs := g.take(m)
	g.mu.Unlock()
	g.log.LogAttrs(context.Background(), slog.LevelInfo, "shadow: would have refused", attrs...)
}

// Flush writes every mechanism's pending counts.
func (g *Log) Flush() {
	for m := range NumMechanisms {
		g.mu.Lock()
		attrs := g.take(m)
		g.mu.Unlock()
		if len(attrs) > 1 {
			g.log.LogAttrs(context.Background(), slog.LevelInfo, "shadow: would have refused", attrs...)
		}
	}
}

// take returns m's line and clears its counts; g.mu is held.
func (g *Log) take(m Mechanism) []slog.Attr {
	attrs := []slog.Attr{slog.String("mechanism", m.String())}
	for r, name := range Reasons[m] {
		for l, n := range g.pending[m][r] {
			if n > 0 {
				attrs = append(attrs, slog.Int64(name+"."+criticality.Level(l).String(), n))
				g.pending[m][r][l] = 0
			}
		}
	}
	return attrs
}

func reasonIndex(m Mechanism, reason string) int {
	for i, r := range Reasons[m] {
		if r == reason && i < maxReasons {
			return i
		}
	}
	return -1
}
