package triageyaml_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
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

// Run re-reads the file every interval of its clock and stops with its
// context.
func TestWatchQuotaRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "quota.yaml")
	os.WriteFile(path, []byte("customers: {ads: {cpu: 2}}\n"), 0o600)
	clk := clock.NewFake(time.Unix(0, 0))
	applied := make(chan float64, 4)
	w, err := triageyaml.WatchQuota(path, func(p *quota.Policy) {
		v, _ := p.Limit("ads", criticality.Critical)
		applied <- v
	}, triageyaml.WithWatchClock(clk), triageyaml.WithWatchInterval(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	<-applied // the initial load
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, nil) }()
	os.WriteFile(path, []byte("customers: {ads: {cpu: 5}}\n"), 0o600)
	stop := make(chan struct{})
	defer close(stop)
	if !clk.BlockUntil(1, stop) {
		t.Fatal("Run set no timer")
	}
	clk.Advance(time.Second)
	if v := <-applied; v != 5 {
		t.Errorf("reloaded limit %v, want 5", v)
	}
	cancel()
	if err := <-done; err != context.Canceled {
		t.Errorf("Run returned %v", err)
	}
}
