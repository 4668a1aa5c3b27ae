package triageyaml_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triageyaml"
)

// A changed file is applied; a bad push (NaN, a negative limit, an
// unknown level, garbage, a deleted file) is refused and the last good
// policy stays in force.
func TestWatchQuotaReloadsAndRefusesBadPushes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "quota.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("customers: {ads: {cpu: 2}}\n")
	var cur *quota.Policy
	w, err := triageyaml.WatchQuota(path, func(p *quota.Policy) { cur = p })
	if err != nil {
		t.Fatal(err)
	}
	limit := func() float64 { v, _ := cur.Limit("ads", criticality.Critical); return v }
	if limit() != 2 {
		t.Fatalf("initial limit %v", limit())
	}
	if changed, err := w.Check(); changed || err != nil {
		t.Errorf("unchanged file: %v %v", changed, err)
	}
	write("customers: {ads: {cpu: 3}}\n")
	if changed, err := w.Check(); !changed || err != nil || limit() != 3 {
		t.Fatalf("reload: %v %v, limit %v", changed, err, limit())
	}
	for _, bad := range []string{
		"customers: {ads: {cpu: .nan}}\n",
		"customers: {ads: {cpu: -1}}\n",
		"customers: {ads: {cpu: 1, criticality: {URGENT: 1}}}\n",
		"customers: {'': {cpu: 1}}\n",
		"customers: {ads: {cpu: 1e300}}\n",
		"\x00\x01garbage",
	} {
		write(bad)
		if changed, err := w.Check(); changed || err == nil {
			t.Errorf("bad push %q: changed %v, err %v", bad, changed, err)
		}
		if limit() != 3 {
			t.Fatalf("bad push %q replaced the policy", bad)
		}
	}
	os.Remove(path)
	if _, err := w.Check(); err == nil || limit() != 3 {
		t.Error("deleted file")
	}
	if reloads, refusals, lastErr := w.Stats(); reloads != 2 || refusals != 7 || lastErr == nil {
		t.Errorf("stats %d reloads, %d refusals, %v", reloads, refusals, lastErr)
	}
	if _, err := triageyaml.WatchQuota(path, func(*quota.Policy) {}); err == nil {
		t.Error("missing initial file accepted")
	}
}
