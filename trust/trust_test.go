package trust_test

import (
	"net/netip"
	"testing"

	"github.com/triagehq/triage/trust"
)

func TestTrusted(t *testing.T) {
	pol := trust.MustNew(trust.Config{
		Networks:   []string{"127.0.0.2/32", "10.1.0.0/16", "::1/128"},
		Identities: []string{"spiffe://prod/frontend"},
	})
	addr := netip.MustParseAddr
	tests := []struct {
		name string
		peer trust.Peer
		want bool
	}{
		{"in network", trust.Peer{Addr: addr("127.0.0.2")}, true},
		{"ipv4-mapped", trust.Peer{Addr: addr("::ffff:127.0.0.2")}, true},
		{"other loopback", trust.Peer{Addr: addr("127.0.0.3")}, false},
		{"v6 loopback", trust.Peer{Addr: addr("::1")}, true},
		{"in /16", trust.Peer{Addr: addr("10.1.200.3")}, true},
		{"unknown address, no identity", trust.Peer{}, false},
		{"identity", trust.Peer{Addr: addr("192.0.2.1"), Identities: []string{"spiffe://prod/frontend"}}, true},
		{"identity is exact", trust.Peer{Identities: []string{"spiffe://prod/frontend/x", "SPIFFE://prod/frontend"}}, false},
	}
	for _, tt := range tests {
		if got := pol.Trusted(tt.peer); got != tt.want {
			t.Errorf("%s: Trusted = %v, want %v", tt.name, got, tt.want)
		}
	}
	var none *trust.Policy
	if none.Trusted(trust.Peer{Addr: addr("127.0.0.1")}) {
		t.Error("nil policy trusted a peer")
	}
	if (&trust.Policy{}).Trusted(trust.Peer{Addr: addr("127.0.0.1"), Identities: []string{""}}) {
		t.Error("zero policy trusted a peer")
	}
}

func TestNewErrors(t *testing.T) {
	for _, c := range []trust.Config{
		{Networks: []string{"127.0.0.1"}},
		{Networks: []string{"not a network"}},
		{Networks: []string{"10.0.0.0/33"}},
		{Identities: []string{" "}},
	} {
		if _, err := trust.New(c); err == nil {
			t.Errorf("New(%+v) succeeded", c)
		}
	}
}
