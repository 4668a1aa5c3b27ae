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
//
// URI SANs and DNS SANs are two namespaces: an identity with a scheme
// ("spiffe://cluster.local/ns/shop/sa/frontend") matches only a URI SAN, a
// name without one ("frontend.shop.svc") only a DNS SAN.
//
// Behind a proxy that terminates mTLS (a mesh's sidecar, an ingress) the
// peer is the proxy, and the caller's certificate reaches the service in
// the proxy's x-forwarded-client-cert header (Envoy's XFCC, which Istio
// sets). Config.Forwarders names the proxies whose header is believed; from
// any other peer the header is ignored. Resolve turns a request that came
// through one into its caller: the identities of the header's last element,
// the one the nearest proxy appended.
package trust

import (
	"crypto/tls"
	"fmt"
	"net/netip"
	"net/url"
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
	// ForwardedClientCert is the request's x-forwarded-client-cert header
	// as received (its last line, if several), or "": read by Resolve, and
	// only when the peer is one of the policy's forwarders.
	ForwardedClientCert string
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
	forwarders *trustSet // nil: no proxy's x-forwarded-client-cert is read
}

// Config is the serializable form of a Policy.
type Config struct {
	// Networks are CIDR prefixes ("10.0.0.0/8", "127.0.0.1/32", "::1/128")
	// whose peers are trusted. Empty: no network is trusted.
	Networks []string `yaml:"networks" json:"networks"`
	// Identities are exact authenticated identities that are trusted: a
	// URI SAN, written with its scheme ("spiffe://..."), or a DNS SAN, a
	// name without one. Empty: no identity is trusted.
	Identities []string `yaml:"identities" json:"identities"`
	// Forwarders are the proxies (by network or identity) whose
	// x-forwarded-client-cert header names the caller, for a service behind
	// a mesh's sidecar or an mTLS-terminating ingress: the caller is then
	// trusted if an identity of the header's last element is in
	// Identities. The proxy must set the header itself (Envoy's
	// forward_client_cert_details SANITIZE_SET or APPEND_FORWARD, Istio's
	// default), or a client could write it. Empty: the header is ignored.
	Forwarders Forwarders `yaml:"forwarders" json:"forwarders"`
}

// Forwarders names proxies by network (CIDR prefixes) or by identity (as
// Config.Identities).
type Forwarders struct {
	Networks   []string `yaml:"networks" json:"networks"`
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
	p, err := compileSet(c.Networks, c.Identities)
	if err != nil {
		return nil, err
	}
	if len(c.Forwarders.Networks)+len(c.Forwarders.Identities) > 0 {
		if p.forwarders, err = compileSet(c.Forwarders.Networks, c.Forwarders.Identities); err != nil {
			return nil, fmt.Errorf("trust: forwarders: %w", err)
		}
	}
	return p, nil
}

func compileSet(networks, identities []string) (*trustSet, error) {
	p := &trustSet{identities: make(map[string]struct{}, len(identities))}
	for _, n := range networks {
		pfx, err := netip.ParsePrefix(strings.TrimSpace(n))
		if err != nil {
			return nil, fmt.Errorf("trust: network %q: %w", n, err)
		}
		p.networks = append(p.networks, pfx.Masked())
	}
	for _, id := range identities {
		if err := checkIdentity(id); err != nil {
			return nil, err
		}
		p.identities[id] = struct{}{}
	}
	return p, nil
}

// checkIdentity accepts a URI with a scheme or a DNS name: a name may not
// hold ':' (no DNS name does), so the two namespaces cannot meet.
func checkIdentity(id string) error {
	switch {
	case strings.TrimSpace(id) == "":
		return fmt.Errorf("trust: empty identity")
	case id != strings.TrimSpace(id):
		return fmt.Errorf("trust: identity %q has surrounding spaces", id)
	case strings.Contains(id, ":") && !isURI(id):
		return fmt.Errorf("trust: identity %q: a URI SAN is written scheme://... (or urn:...), a DNS SAN has no ':'", id)
	}
	return nil
}

// isURI reports whether id is written as an absolute URI with an
// authority (spiffe://..., https://...) or a URN: what a URI SAN names a
// workload with, and never "host:port".
func isURI(id string) bool {
	u, err := url.Parse(id)
	return err == nil && u.Scheme != "" && (strings.Contains(id, "://") || strings.EqualFold(u.Scheme, "urn"))
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
// trusts nobody. It does not allocate. A request that came through a
// forwarder is judged by its caller: pass Resolve's answer.
func (pol *Policy) Trusted(p Peer) bool {
	if pol == nil {
		return false
	}
	set := pol.set.Load()
	return set != nil && set.has(p)
}

func (set *trustSet) has(p Peer) bool {
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

// Resolve returns the caller of a request from peer p. When p is one of
// the policy's forwarders and the request has an x-forwarded-client-cert
// header, the caller is whom the header's last element names: its URI and
// DNS SANs as Identities, and no address (a forwarded caller is trusted
// by identity only). A header that does not parse, or is longer than
// wire.ForwardedClientCertMaxLen, names a caller with no identity. From
// any other peer, or without the header, Resolve returns p without its
// ForwardedClientCert. It allocates only for a forwarded request.
func (pol *Policy) Resolve(p Peer) Peer {
	xfcc := p.ForwardedClientCert
	p.ForwardedClientCert = ""
	if xfcc == "" || pol == nil {
		return p
	}
	set := pol.set.Load()
	if set == nil || set.forwarders == nil || !set.forwarders.has(p) {
		return p
	}
	return Peer{Identities: LastForwardedIdentities(xfcc)}
}

// Identities returns the identities of a TLS connection's verified client
// certificate: its URI SANs that have a scheme (RFC 5280 requires one),
// then its DNS SANs. A connection without a verified chain (no
// certificate, or one that was not verified) has none. Adapters fill
// Peer.Identities with it.
func Identities(cs *tls.ConnectionState) []string {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return nil
	}
	leaf := cs.VerifiedChains[0][0]
	ids := make([]string, 0, len(leaf.URIs)+len(leaf.DNSNames))
	for _, u := range leaf.URIs {
		if u.Scheme != "" {
			ids = append(ids, u.String())
		}
	}
	for _, d := range leaf.DNSNames {
		if !strings.Contains(d, ":") {
			ids = append(ids, d)
		}
	}
	return ids
}
