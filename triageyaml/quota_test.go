package triageyaml_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/triageyaml"
)

const goodQuota = `default: {cpu: 0.1}
fallback: safe
tasks: 3
customers:
  gmail: {cpu: 4}
  calendar: {cpu: 4, criticality: {SHEDDABLE: 1}}
  android: {cpu: 3}
  batch: {cpu: 0.5, hard: true}
`

func TestLoadQuota(t *testing.T) {
	path := filepath.Join(t.TempDir(), "quota.yaml")
	if err := os.WriteFile(path, []byte(goodQuota), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := triageyaml.LoadQuota(path)
	if err != nil {
		t.Fatal(err)
	}
	if cpu, hard := p.Limit("calendar", criticality.Sheddable); cpu != 1 || hard {
		t.Errorf("calendar SHEDDABLE: %v %v", cpu, hard)
	}
	if cpu, hard := p.Limit("batch", criticality.Critical); cpu != 0.5 || !hard {
		t.Errorf("batch: %v %v", cpu, hard)
	}
}

func TestParseQuotaErrors(t *testing.T) {
	for name, in := range map[string]string{
		"empty":          "",
		"unknown field":  "default: {cpu: 1}\ncustomer: {}\n",
		"NaN":            "default: {cpu: .nan}\n",
		"infinite":       "default: {cpu: .inf}\n",
		"negative":       "default: {cpu: 1}\ncustomers: {a: {cpu: -2}}\n",
		"huge":           "default: {cpu: 1e300}\n",
		"blank name":     "default: {cpu: 1}\ncustomers: {'': {cpu: 1}}\n",
		"unknown level":  "default: {cpu: 1}\ncustomers: {a: {cpu: 1, criticality: {HIGH: 1}}}\n",
		"bad fallback":   "default: {cpu: 1}\nfallback: closed\n",
		"wrong type":     "default: {cpu: lots}\n",
		"two documents":  "default: {cpu: 1}\n---\ndefault: {cpu: 1}\n",
		"duplicate name": "default: {cpu: 1}\ncustomers:\n  a: {cpu: 1}\n  a: {cpu: 2}\n",
	} {
		if _, err := triageyaml.ParseQuota([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.HasPrefix(err.Error(), "triageyaml: ") {
			t.Errorf("%s: error %q lacks the package prefix", name, err)
		}
	}
}

// FuzzParseQuota: whatever the bytes, ParseQuota returns a policy whose
// every limit is a finite, non-negative number, or an error; never a panic.
func FuzzParseQuota(f *testing.F) {
	f.Add([]byte(goodQuota))
	f.Add([]byte("default: {cpu: .nan}\n"))
	f.Add([]byte("customers: {a: {cpu: 1, criticality: {CRITICAL_PLUS: 0.5}}}\n"))
	f.Add([]byte("&a [*a]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := triageyaml.ParseQuota(b)
		if err != nil {
			return
		}
		for _, c := range append(p.Customers(), "someone-else") {
			for _, l := range criticality.All() {
				if cpu, _ := p.Limit(c, l); !(cpu >= 0 && cpu <= 1e6) {
					t.Fatalf("%s/%v: limit %v accepted", c, l, cpu)
				}
			}
		}
	})
}
