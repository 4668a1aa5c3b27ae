package wire_test

import (
	"net/textproto"
	"strings"
	"testing"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/wire"
)

func TestEveryKeyHasThePrefixAndABound(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range wire.Keys() {
		if !strings.HasPrefix(k.Name, wire.Prefix) {
			t.Errorf("%q lacks the prefix %q: the edge would not strip it", k.Name, wire.Prefix)
		}
		if k.Name != strings.ToLower(k.Name) {
			t.Errorf("%q is not lower case (gRPC metadata keys must be)", k.Name)
		}
		if k.MaxLen <= 0 || k.MaxLen > 64 {
			t.Errorf("%q has bound %d", k.Name, k.MaxLen)
		}
		if k.Direction != wire.Request && k.Direction != wire.Response {
			t.Errorf("%q has no direction", k.Name)
		}
		if seen[k.Name] {
			t.Errorf("%q registered twice", k.Name)
		}
		seen[k.Name] = true
		if !wire.IsTriage(k.Name) {
			t.Errorf("IsTriage(%q) = false", k.Name)
		}
	}
	if k, ok := wire.Lookup("Triage-Criticality"); !ok || k.MaxLen != criticality.MaxNameLen {
		t.Errorf("criticality key bound %d, want %d", k.MaxLen, criticality.MaxNameLen)
	}
}

func TestIsTriage(t *testing.T) {
	for name, want := range map[string]bool{
		"triage-criticality": true,
		"TRIAGE-Whatever":    true,
		"triage-":            true,
		"triage":             false,
		"x-triage-foo":       false,
		"":                   false,
		"content-type":       false,
		"Triage_Criticality": true,
		"triage_":            true,
		"triage.criticality": false,
		"triagecriticality":  false,
	} {
		if got := wire.IsTriage(name); got != want {
			t.Errorf("IsTriage(%q) = %v, want %v", name, got, want)
		}
	}
	for name, want := range map[string]bool{
		"Triage_Criticality": true,
		"triage-customer_id": true,
		"triage-criticality": false,
		"x_triage-foo":       false,
	} {
		if got := wire.Folded(name); got != want {
			t.Errorf("Folded(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestCanonicalSpellings(t *testing.T) {
	for key, header := range map[string]string{
		wire.CriticalityKey:         wire.CriticalityHeader,
		wire.DecayKey:               wire.DecayHeader,
		wire.AttemptKey:             wire.AttemptHeader,
		wire.CustomerKey:            wire.CustomerHeader,
		wire.OutcomeKey:             wire.OutcomeHeader,
		wire.LameDuckKey:            wire.LameDuckHeader,
		wire.ForwardedClientCertKey: wire.ForwardedClientCertHeader,
		wire.LoadReportKey:          wire.LoadReportBinHeader,
		"endpoint-load-metrics":     wire.LoadReportHeader,
	} {
		if got := textproto.CanonicalMIMEHeaderKey(key); got != header {
			t.Errorf("%s is spelled %q, net/http spells it %q", key, header, got)
		}
		if got := wire.Header(key); got != header {
			t.Errorf("Header(%q) = %q, want %q", key, got, header)
		}
	}
	for _, k := range wire.Keys() {
		if got, want := wire.Header(k.Name), textproto.CanonicalMIMEHeaderKey(k.Name); got != want {
			t.Errorf("Header(%q) = %q, want %q", k.Name, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = wire.Header(wire.CustomerKey) }); n != 0 {
		t.Errorf("Header of a registered key allocates %v times", n)
	}
}

func TestClaimed(t *testing.T) {
	for in, want := range map[string]string{
		"x-triage-claimed-criticality": "triage-criticality",
		"X-Triage-Claimed-Customer":    "triage-customer",
		"x-triage-claimed-":            "",
		"x-triage-claim-criticality":   "",
		"triage-criticality":           "",
	} {
		got, ok := wire.Claimed(in)
		if got != want || ok != (want != "") {
			t.Errorf("Claimed(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}
