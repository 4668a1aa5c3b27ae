package triageyaml_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/triageyaml"
	"github.com/triagehq/triage/trust"
)

const good = `
trust:
  networks: ["10.0.0.0/8"]
criticality:
  default: SHEDDABLE_PLUS
  rules:
    - header: true
    - host: batch.example.com
      criticality: SHEDDABLE
    - path_prefix: /checkout
      criticality: CRITICAL_PLUS
    - path_prefix: /home
      criticality: CRITICAL
      decay: {after: 2s, to: SHEDDABLE}
`

func TestLoadEdge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(path, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	e, err := triageyaml.LoadEdge(path)
	if err != nil {
		t.Fatal(err)
	}
	pol, cl, err := e.Build()
	if err != nil {
		t.Fatal(err)
	}
	if d := cl.Classify(&edge.Request{Host: "batch.example.com"}); d.Level != criticality.Sheddable {
		t.Errorf("host rule gave %v", d.Level)
	}
	if d := cl.Classify(&edge.Request{Path: "/home"}); d.Decay != (edge.Decay{After: 2 * time.Second, To: criticality.Sheddable}) {
		t.Errorf("decay rule gave %+v", d)
	}
	if d := cl.Classify(&edge.Request{Path: "/"}); d.Level != criticality.SheddablePlus {
		t.Errorf("default gave %v", d.Level)
	}
	if !pol.Trusted(trust.Peer{Identities: nil, Addr: mustAddr("10.2.3.4")}) {
		t.Error("trusted network not trusted")
	}
}

func TestParseEdgeErrors(t *testing.T) {
	tests := map[string]string{
		"empty":           "",
		"unknown field":   "criticality:\n  defualt: CRITICAL\n",
		"bad level":       "criticality:\n  default: HIGH\n",
		"bad rule":        "criticality:\n  rules:\n    - host: a.com\n",
		"bad network":     "trust:\n  networks: [10.0.0.0]\n",
		"two documents":   "criticality: {}\n---\ncriticality: {}\n",
		"not a mapping":   "- 1\n- 2\n",
		"wrong type":      "criticality:\n  rules: yes\n",
		"too large":       "# " + strings.Repeat("x", triageyaml.MaxSize) + "\n",
		"tab indentation": "criticality:\n\tdefault: CRITICAL\n",
		"decay typo":      "criticality:\n  rules:\n    - path_prefix: /a\n      criticality: CRITICAL\n      decay: {afer: 2s, to: SHEDDABLE}\n",
		"decay upward":    "criticality:\n  rules:\n    - path_prefix: /a\n      criticality: SHEDDABLE\n      decay: {after: 2s, to: CRITICAL}\n",
	}
	for name, in := range tests {
		if _, err := triageyaml.ParseEdge([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.HasPrefix(err.Error(), "triageyaml: ") {
			t.Errorf("%s: error %q lacks the package prefix", name, err)
		}
	}
	if _, err := triageyaml.LoadEdge(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("missing file accepted")
	}
}

func FuzzParseEdge(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("criticality:\n  rules:\n    - {header: true, criticality: CRITICAL}\n"))
	f.Add([]byte("&a [*a]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := triageyaml.ParseEdge(b)
		if err != nil {
			return
		}
		if _, _, err := e.Build(); err != nil {
			t.Fatalf("ParseEdge accepted a config Build refuses: %v", err)
		}
	})
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
