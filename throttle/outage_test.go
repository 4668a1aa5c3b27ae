package throttle_test

// Outages: a backend that refuses everything for seconds, then answers
// again (the drill's storm fault).

import (
	"testing"
	"time"

	"github.com/triagehq/triage/criticality"
)

// outageRecovery runs one client through a minute of healthy traffic at
// each level's rate in mix, then an outage of 5 s whose requests the
// backend rejects at once, then a healthy backend again. It returns the
// share of requests rejected locally in the outage's last 3 s and, per
// level, how long after the outage it last rejected one locally (0:
// never).
func outageRecovery(t *testing.T, seed uint64, mix []levelRate) (float64, map[criticality.Level]time.Duration) {
	t.Helper()
	th := newClients(t, 1, seed)[0]
	from, to := epoch.Add(time.Minute), epoch.Add(time.Minute+5*time.Second)
	var offered, local int
	last := map[criticality.Level]time.Duration{}
	const tick = time.Millisecond
	for now := epoch; now.Before(to.Add(10 * time.Second)); now = now.Add(tick) {
		for _, m := range mix {
			if int64(now.Sub(epoch)/tick)%int64(time.Second/tick/time.Duration(m.rate)) != 0 {
				continue
			}
			late := now.After(to.Add(-3*time.Second)) && now.Before(to)
			if late {
				offered++
			}
			tk, ok := th.AllowAt(m.level, now)
			switch {
			case !ok && late:
				local++
			case !ok && !now.Before(to):
				last[m.level] = now.Sub(to)
			case ok:
				tk.Done(now.Before(from) || !now.Before(to))
			}
		}
	}
	return float64(local) / float64(offered), last
}

// levelRate is requests a second at one level.
type levelRate struct {
	level criticality.Level
	rate  int
}

// The drill's mix of criticalities: 10, 40, 25 and 25 requests a second.
var drillMix = []levelRate{{criticality.CriticalPlus, 10}, {criticality.Critical, 40}, {criticality.SheddablePlus, 25}, {criticality.Sheddable, 25}}

// An outage ends for every level together: a level throttled at the 95%
// cap sends a request every 2 s at 10 a second, too few to learn soon
// that the backend answers again, and the other levels' answers tell it.
// In the drill's storm fault the frontend's CRITICAL_PLUS and sheddable
// levels went on rejecting locally for seconds after the DB tier came
// back. Here every level stops within 1 s (2.4 s before this rule), and
// the outage is throttled as hard as before: 83-86% of its last 3 s's
// requests rejected locally, for these seeds, before the rule and after.
func TestOutageEndsForEveryLevel(t *testing.T) {
	var worst time.Duration
	for seed := uint64(1); seed <= 8; seed++ {
		share, last := outageRecovery(t, seed, drillMix)
		if share < 0.8 {
			t.Errorf("seed %d: %.0f%% rejected locally in the outage's last 3 s, want at least 80%%", seed, 100*share)
		}
		for l, d := range last {
			worst = max(worst, d)
			if d > time.Second {
				t.Errorf("seed %d: %v rejected locally until %v after the outage", seed, l, d)
			}
		}
	}
	t.Logf("the latest local rejection after the outage, 8 seeds: %v", worst)
}

// The outage's history stays history when the backend, back, sheds a
// little of its backlog. In the drill's storm fault the DB tier, continued
// after 5 s stopped, met the calls that had waited in its sockets and
// refused some fresh sheddable ones; a refusal within the last second made
// the short window, which still held the outage, decide again, and the
// tiers above rejected sheddable calls locally for another second or two
// while the DB accepted most of them. Here one client at the drill's mix
// sees a minute of a healthy backend, 5 s of an outage, a second in which
// the backend refuses one SHEDDABLE request in three (a rate K = 2
// tolerates), then a healthy backend. SHEDDABLE stops rejecting locally
// within 1 s of the outage, as it does when the backend refuses nothing
// (TestOutageEndsForEveryLevel), and the outage itself is throttled as
// before.
func TestOutageHistoryIsNotAnOnset(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		th := newClients(t, 1, seed)[0]
		from, to := epoch.Add(time.Minute), epoch.Add(time.Minute+5*time.Second)
		var during, duringLocal, late, sent, refused int
		var last time.Duration
		const tick = time.Millisecond
		for now := epoch; now.Before(to.Add(5 * time.Second)); now = now.Add(tick) {
			for _, m := range drillMix {
				if int64(now.Sub(epoch)/tick)%int64(time.Second/tick/time.Duration(m.rate)) != 0 {
					continue
				}
				tk, ok := th.AllowAt(m.level, now)
				outage := !now.Before(from) && now.Before(to)
				shed := m.level == criticality.Sheddable
				switch {
				case shed && outage && now.After(to.Add(-3*time.Second)):
					during++
					if !ok {
						duringLocal++
					}
				case shed && !ok && !now.Before(to):
					last = now.Sub(to)
					if last > time.Second {
						late++
					}
				}
				if !ok {
					continue
				}
				accept := !outage
				if shed && !now.Before(to) && now.Before(to.Add(time.Second)) {
					if sent++; sent%3 == 0 {
						accept = false // the backlog: one fresh request in three refused
						refused++
					}
				}
				tk.Done(accept)
			}
		}
		if duringLocal < during*8/10 {
			t.Errorf("seed %d: %d of %d SHEDDABLE requests rejected locally in the outage's last 3 s, want at least 80%%", seed, duringLocal, during)
		}
		if last > time.Second {
			t.Errorf("seed %d: SHEDDABLE rejected locally until %v after the outage, %d of its requests after the first second (the backend refused %d of the first second's %d)", seed, last, late, refused, sent)
		}
	}
}
