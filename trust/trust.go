// Package trust decides which peers may set triage's request metadata.
//
// The SRE book (ch. 21, "Criticality") sets criticality "as close as possible
// to the browsers or mobile clients—typically in the HTTP frontends" and
// propagates it from there. Values that arrive from outside that perimeter
// are not believed: a caller could otherwise mark all its traffic
// CRITICAL_PLUS and defeat load shedding. A Policy names the peers the
// operator trusts, by network or by authenticated identity (an mTLS
// certificate's URI or DNS SAN, e.g. a SPIFFE ID). Nothing is trusted by
// default, and a peer with no authenticated identity outside the trusted
// networks is untrusted.
package trust

import (
	"crypto/tls"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
)

// Peer is what an adapter knows about the caller of one request.
type Peer struct {
	// Addr is the remote IP address; the zero Addr means unknown.
	Addr netip.Addr
	// Identities are the identities the transport authenticated, e.g. the
	// URI and DNS SANs of a verified client certificate. Unverified
	// certificates must not be listed.
	Identities []string
}

// Policy says which peers are trusted. The zero value trusts nobody.
// A Policy is safe for concurrent use; Update replaces its configuration
// at once for every later call. Its size is bounded by the configuration
// it was built from.
type Policy struct {
	set atomic.Pointer[trustSet]
}

// trustSet is one configuration of a Policy.
type trustSet struct {
	networks   []netip.Prefix
	identities map[string]struct{}
}

// Config is the serializable form of a Policy.
type Config struct {
	// Networks are CIDR prefixes ("10.0.0.0/8", "127.0.0.1/32", "::1/128")
	// whose peers are trusted. Empty: no network is trusted.
	Networks []string `yaml:"networks" json:"networks"`
	// Identities are exact authenticated identities (certificate URI or DNS
	// SANs) that are trusted. Empty: no identity is trusted.
	Identities []string `yaml:"identities" json:"identities"`
}

// New builds a Policy from c. It returns an error naming the first malformed
// network or empty identity.
func New(c Config) (*Policy, error) {
	p := &Policy{}
	if err := p.Update(c); err != nil {
		return nil, err
	}
	return p, nil
}

// Update replaces p's configuration with c, or returns New's error and
// keeps the configuration p had.
func (pol *Policy) Update(c Config) error {
	p, err := compile(c)
	if err != nil {
		return err
	}
	pol.set.Store(p)
	return nil
}

func compile(c Config) (*trustSet, error) {
	p := &trustSet{identities: make(map[string]struct{}, len(c.Identities))}
	for _, n := range c.Networks {
		pfx, err := netip.ParsePrefix(strings.TrimSpace(n))
		if err != nil {
			return nil, fmt.Errorf("trust: network %q: %w", n, err)
		}
		p.networks = append(p.networks, pfx.Masked())
	}
	for _, id := range c.Identities {
		if strings.TrimSpace(id) == "" {
			return nil, fmt.Errorf("trust: empty identity")
		}
		p.identities[id] = struct{}{}
	}
	return p, nil
}

// MustNew is New for literal configurations in tests and examples; it
// panics on error and must not be used with user input.
func MustNew(c Config) *Policy {
	p, err := New(c)
	if err != nil {
		panic(err)
	}
	return p
}

// Trusted reports whether p is trusted: its address lies in a trusted
// network, or one of its authenticated identities is trusted. A nil Policy
// trusts nobody. It does not allocate.
func (pol *Policy) Trusted(p Peer) bool {
	if pol == nil {
		return false
	}
	set := pol.set.Load()
	if set == nil {
		return false
	}
	if p.Addr.IsValid() {
		a := p.Addr.Unmap()
		for _, n := range set.networks {
			if n.Contains(a) {
				return true
			}
		}
	}
	for _, id := range p.Identities {
		if _, ok := set.identities[id]; ok {
			return true
		}
	}
	return false
}

// Identities returns the identities of a TLS connection's verified client
// certificate: its URI SANs, then its DNS SANs. A connection without a
// verified chain (no certificate, or one that was not verified) has none.
// Adapters fill Peer.Identities with it.
func Identities(cs *tls.ConnectionState) []string {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return nil
	}
	leaf := cs.VerifiedChains[0][0]
	ids := make([]string, 0, len(leaf.URIs)+len(leaf.DNSNames))
	for _, u := range leaf.URIs {
		ids = append(ids, u.String())
	}
	return append(ids, leaf.DNSNames...)
}
