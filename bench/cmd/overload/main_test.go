package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// The test binary doubles as the backend process, as the command does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "server" {
		serverCommand(os.Args[2:])
		return
	}
	os.Exit(m.Run())
}

func TestFlagsRejectBadInput(t *testing.T) {
	for _, args := range [][]string{
		{"--loads", "0"}, {"--loads", "x"}, {"--variants", "nginx"}, {"--cost", "1ns"},
		{"--step", "1s"}, {"--deadline", "1ms"}, {"--conns", "0"}, {"--scenario", "chaos"},
		{"--stock", "10"}, {"--stock", "10x0"}, {"--stock", "0x50"}, {"--stock", "5x3000,x"},
		{"--rotate", "-1"}, {"--neighbour", "--server-cpu", ""}, {"--gate-goodput", "-1"}, {"--gate-p99", "0s"}, {"--generator", "h2load"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	if c, err := parseFlags(nil); err != nil || len(c.variants) != len(allVariants) || len(c.loads) != 5 || len(c.stock) != 3 {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
}

func TestRotateTurnsTheVariantsLeft(t *testing.T) {
	for rotate, want := range map[string]string{"0": "a b c", "1": "b c a", "2": "c a b", "4": "b c a"} {
		c, err := parseFlags([]string{"--variants", "none,go-zero,triage", "--rotate", rotate})
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(c.variants, " ")
		want = strings.NewReplacer("a", "none", "b", "go-zero", "c", "triage").Replace(want)
		if got != want {
			t.Errorf("--rotate %s: %s, want %s", rotate, got, want)
		}
	}
}

// The gate fails exactly the triage cells in the bad state, open loop or
// closed, valid or not.
func TestGateFailsEveryBadTriageCell(t *testing.T) {
	rs := []result{
		{Variant: "triage-admission", Load: 10, Goodput: 0.90, P99ms: 60},
		{Variant: "triage-admission", Load: 10, Goodput: 0.21, P99ms: 1305, LateSends: 900},
		{Variant: "triage-admission", Load: 10, Workers: 3000, Goodput: 0.86, P99ms: 993, Valid: true},
		{Variant: "triage", Load: 20, Goodput: 0.84, P99ms: 50},
		{Variant: "oracle-tap16", Load: 10, Goodput: 0.10, P99ms: 2000},
		{Variant: "triage", Load: 5, Goodput: 0.85, P99ms: 100},
	}
	bad := gateFailures(rs, 0.85, 100*time.Millisecond)
	want := []string{"triage-admission 10x: goodput 0.21", "triage-admission 10x/3000w: goodput 0.86", "triage 20x: goodput 0.84"}
	if len(bad) != len(want) {
		t.Fatalf("gate: %q, want %d failures", bad, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(bad[i], w) {
			t.Errorf("failure %d: %q, want it to start %q", i, bad[i], w)
		}
	}
}

// A short run end to end: real processes, real sockets, one step.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts backend processes")
	}
	cfg, err := parseFlags([]string{"--loads", "2", "--variants", "none,triage-admission", "--stock", "2x50", "--step", "2s", "--warmup", "0s", "--json", "--server-cpu", "", "--load-cpu", ""})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if rep.CapacityRPS <= 0 || len(rep.Results) != 4 {
		t.Fatalf("report %+v", rep)
	}
	for _, r := range rep.Results {
		if r.Sent != r.Completed || r.Sent == 0 {
			t.Errorf("%s, %d workers: sent %d, completed %d", r.Variant, r.Workers, r.Sent, r.Completed)
		}
		if r.Variant == "triage-admission" && (!r.Survived || r.Untriaged != 0 || r.Goodput <= 0) {
			t.Errorf("triage-admission: %+v", r)
		}
	}
}
