package subset_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/triagehq/triage/subset"
)

func backendIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("10.0.0.%03d:443", i)
	}
	return ids
}

// A member failing for ReplaceAfter gets one replacement from outside the
// subset; the failed member stays (to be seen back), and when it serves
// again its replacement leaves: one connection added, one removed. A
// member failing for less than ReplaceAfter changes nothing.
func TestKeeperReplacesAFailedMemberTemporarily(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ids := backendIDs(30)
	k := subset.NewKeeper(subset.Deterministic{}, 4, 5, time.Second)
	k.SetBackends(ids)
	base, next := k.Members(t0)
	if len(base) != 5 || next != 0 {
		t.Fatalf("members %v, next %v", base, next)
	}
	k.Report(base[2], true, t0)
	if m, next := k.Members(t0.Add(900 * time.Millisecond)); !slices.Equal(m, base) || next != 100*time.Millisecond {
		t.Fatalf("before ReplaceAfter: %v, next %v", m, next)
	}
	m, next := k.Members(t0.Add(time.Second))
	if len(m) != 6 || !slices.Equal(m[:5], base) || slices.Contains(base, m[5]) || next != 0 {
		t.Fatalf("after ReplaceAfter: %v (base %v), next %v", m, base, next)
	}
	replacement := m[5]
	// Stable: asked again, the same replacement.
	if again, _ := k.Members(t0.Add(5 * time.Second)); !slices.Equal(again, m) {
		t.Fatalf("replacement changed: %v then %v", m, again)
	}
	// The replacement fails in turn: the next one in the client's order.
	k.Report(replacement, true, t0.Add(5*time.Second))
	m2, _ := k.Members(t0.Add(6 * time.Second))
	if len(m2) != 6 || m2[5] == replacement || slices.Contains(base, m2[5]) {
		t.Fatalf("second replacement: %v", m2)
	}
	k.Report(base[2], false, t0.Add(7*time.Second))
	if back, _ := k.Members(t0.Add(7 * time.Second)); !slices.Equal(back, base) {
		t.Fatalf("member back: %v, want %v", back, base)
	}
}

// Clients whose subsets share a failed backend pick their replacements
// spread over the other backends, not all the same one; the clients that
// did not have it change nothing (churn: one connection per affected
// client).
func TestKeeperSpreadsReplacements(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ids := backendIDs(100)
	failed := ids[37]
	picks := map[string]int{}
	affected, changed := 0, 0
	for c := range 300 {
		k := subset.NewKeeper(subset.Ringsteady{}, c, 20, time.Second)
		k.SetBackends(ids)
		before, _ := k.Members(t0)
		k.Report(failed, true, t0)
		after, _ := k.Members(t0.Add(time.Second))
		if slices.Contains(before, failed) {
			affected++
			if len(after) != len(before)+1 || !slices.Equal(after[:len(before)], before) {
				t.Fatalf("client %d: %v -> %v", c, before, after)
			}
			picks[after[len(after)-1]]++
		} else if !slices.Equal(before, after) {
			changed++
		}
	}
	if changed != 0 {
		t.Fatalf("%d clients without the failed backend changed their subset", changed)
	}
	most := 0
	for _, n := range picks {
		most = max(most, n)
	}
	if affected < 30 || len(picks) < 20 || most > affected/4 {
		t.Fatalf("%d affected clients chose %d replacements, the most popular %d times", affected, len(picks), most)
	}
	t.Logf("%d affected clients: %d distinct replacements, at most %d on one backend", affected, len(picks), most)
}

func TestKeeperWithoutSubsetting(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ids := backendIDs(5)
	k := subset.NewKeeper(subset.Deterministic{}, 0, 0, 0)
	k.SetBackends(ids)
	k.Report(ids[1], true, t0)
	if m, _ := k.Members(t0.Add(time.Hour)); !slices.Equal(m, ids) {
		t.Fatalf("every backend a member: %v", m)
	}
	// A backend gone from the list is forgotten.
	k.SetBackends(ids[2:])
	if m, _ := k.Members(t0.Add(time.Hour)); !slices.Equal(m, ids[2:]) {
		t.Fatalf("after the list shrank: %v", m)
	}
}

// A member that announces it is leaving (lame duck: a restart, a drain)
// is replaced at once rather than after ReplaceAfter, so that its share
// does not fall on the rest of the subset meanwhile; when it serves again
// the replacement leaves, as for a failure.
func TestKeeperReplacesALeavingMemberAtOnce(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	k := subset.NewKeeper(subset.Deterministic{}, 1, 3, time.Minute)
	k.SetBackends(backendIDs(10))
	base, _ := k.Members(t0)
	k.Leaving(base[0], t0)
	m, next := k.Members(t0)
	if len(m) != 4 || !slices.Equal(m[:3], base) || slices.Contains(base, m[3]) || next != 0 {
		t.Fatalf("a leaving member: %v (base %v), next %v; want one replacement at once", m, base, next)
	}
	// Failing afterwards (its connection closes as it exits) keeps the
	// replacement; serving again removes it.
	k.Report(base[0], true, t0.Add(time.Second))
	if again, _ := k.Members(t0.Add(time.Second)); !slices.Equal(again, m) {
		t.Fatalf("the leaving member's connection failed: %v, want %v", again, m)
	}
	k.Report(base[0], false, t0.Add(2*time.Second))
	if back, _ := k.Members(t0.Add(2 * time.Second)); !slices.Equal(back, base) {
		t.Fatalf("member back: %v, want %v", back, base)
	}
}
