package trust_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/triagehq/triage/trust"
	"github.com/triagehq/triage/wire"
)

// Headers as Envoy documents them (configuration/http/http_conn_man/headers,
// x-forwarded-client-cert) and as Istio's sidecars send them.
const (
	envoyOne   = `By=http://frontend.lyft.com;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;Subject="/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client";URI=http://testclient.lyft.com`
	envoyTwo   = `By=http://frontend.lyft.com;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;URI=http://testclient.lyft.com,By=http://backend.lyft.com;Hash=9ba61d6425303443c0748a02dd8de688468ed33be74eee6556d90c0149c1309e;URI=http://frontend.lyft.com`
	envoyDNS   = `By=http://frontend.lyft.com;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;Subject="/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client";URI=http://testclient.lyft.com;DNS=lyft.com;DNS=www.lyft.com`
	istioSleep = `By=spiffe://cluster.local/ns/foo/sa/httpbin;Hash=e9c6b4ba3a7a95c2da8e4e4ee0ea7b8bbcd33f3b5a2e0a3e2c1c3e0bb8c1f4f2;Subject="";URI=spiffe://cluster.local/ns/foo/sa/sleep`
	// A Subject with the separators quoted, an escaped quote, and a Cert.
	quoted = `By=spiffe://cluster.local/ns/shop/sa/shop;Hash=ab;Cert="-----BEGIN%20CERTIFICATE-----%0AMIIB...%0A-----END%20CERTIFICATE-----%0A";Subject="CN=a,O=b;c=\"d\"";URI=spiffe://cluster.local/ns/shop/sa/frontend;DNS=frontend.shop.svc`
)

func TestLastForwardedIdentities(t *testing.T) {
	for _, tt := range []struct {
		name, xfcc string
		want       []string
	}{
		{"envoy, one element", envoyOne, []string{"http://testclient.lyft.com"}},
		{"envoy, two elements: the last", envoyTwo, []string{"http://frontend.lyft.com"}},
		{"envoy, URI and DNS", envoyDNS, []string{"http://testclient.lyft.com", "lyft.com", "www.lyft.com"}},
		{"istio", istioSleep, []string{"spiffe://cluster.local/ns/foo/sa/sleep"}},
		{"quoted separators and escapes", quoted, []string{"spiffe://cluster.local/ns/shop/sa/frontend", "frontend.shop.svc"}},
		{"keys are case-insensitive", `by=spiffe://a/b;uri=spiffe://c/d;dns=e`, []string{"spiffe://c/d", "e"}},
		{"a client's own element before the proxy's is not read", `URI=spiffe://forged/admin,By=spiffe://p/q;Hash=00;Subject=""`, nil},
		{"a URI without a scheme is not a URI SAN", `URI=frontend;DNS=frontend`, []string{"frontend"}},
		{"a DNS value with ':' is not a DNS SAN", `DNS=spiffe://x/y`, nil},
		{"an unbalanced quote names nobody", `URI=spiffe://a/b;Subject="CN=x`, nil},
		{"a pair without '=' names nobody", `URI=spiffe://a/b;junk`, nil},
		{"a quote inside an unquoted value names nobody", `URI=spiffe://a/b";DNS=c`, nil},
		{"empty", ``, nil},
		{"a trailing comma: an empty last element", envoyOne + ",", nil},
		{"too long", envoyOne + ";Cert=" + strings.Repeat("x", wire.ForwardedClientCertMaxLen), nil},
	} {
		if got := trust.LastForwardedIdentities(tt.xfcc); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
	many := strings.Repeat("DNS=a;", 40) + "DNS=a"
	if got := trust.LastForwardedIdentities(many); len(got) != 16 {
		t.Errorf("41 DNS values: %d identities, want the bound, 16", len(got))
	}
}

// Behind a mesh's sidecar (Istio): the service's peer is its own proxy on
// loopback; the caller is who that proxy's header names, and only its
// header counts.
func TestForwardedCallerBehindAMesh(t *testing.T) {
	pol := trust.MustNew(trust.Config{
		Identities: []string{"spiffe://cluster.local/ns/foo/sa/sleep"},
		Forwarders: trust.Forwarders{Networks: []string{"127.0.0.6/32", "::1/128"}},
	})
	proxy := netip.MustParseAddr("127.0.0.6")
	stranger := netip.MustParseAddr("10.1.2.3")
	for _, tt := range []struct {
		name string
		peer trust.Peer
		want bool
	}{
		{"the caller the sidecar names", trust.Peer{Addr: proxy, ForwardedClientCert: istioSleep}, true},
		{"another caller", trust.Peer{Addr: proxy, ForwardedClientCert: strings.Replace(istioSleep, "sa/sleep", "sa/attacker", 1)}, false},
		{"a forged element before the sidecar's", trust.Peer{Addr: proxy, ForwardedClientCert: istioSleep + `,By=spiffe://cluster.local/ns/foo/sa/httpbin;Hash=00;Subject=""`}, false},
		{"the sidecar without a header: the proxy itself, not trusted", trust.Peer{Addr: proxy}, false},
		{"the header from a peer that is not a forwarder", trust.Peer{Addr: stranger, ForwardedClientCert: istioSleep}, false},
		{"a header that does not parse", trust.Peer{Addr: proxy, ForwardedClientCert: `URI="spiffe://cluster.local/ns/foo/sa/sleep`}, false},
	} {
		got := pol.Resolve(tt.peer)
		if got.ForwardedClientCert != "" {
			t.Errorf("%s: Resolve kept the header", tt.name)
		}
		if pol.Trusted(got) != tt.want {
			t.Errorf("%s: trusted %v, want %v (resolved to %+v)", tt.name, !tt.want, tt.want, got)
		}
	}
	// A forwarded caller is trusted by identity only, never by the
	// proxy's address, even when the proxy's network is trusted.
	both := trust.MustNew(trust.Config{Networks: []string{"127.0.0.6/32"}, Forwarders: trust.Forwarders{Networks: []string{"127.0.0.6/32"}}})
	if both.Trusted(both.Resolve(trust.Peer{Addr: proxy, ForwardedClientCert: istioSleep})) {
		t.Error("a forwarded caller with no trusted identity was trusted for its proxy's address")
	}
	if !both.Trusted(both.Resolve(trust.Peer{Addr: proxy})) {
		t.Error("the trusted proxy without a header was not trusted")
	}
	// A forwarder named by its certificate's identity.
	byID := trust.MustNew(trust.Config{
		Identities: []string{"frontend.shop.svc"},
		Forwarders: trust.Forwarders{Identities: []string{"spiffe://cluster.local/ns/ingress/sa/gateway"}},
	})
	gw := trust.Peer{Addr: stranger, Identities: []string{"spiffe://cluster.local/ns/ingress/sa/gateway"}, ForwardedClientCert: quoted}
	if !byID.Trusted(byID.Resolve(gw)) {
		t.Error("the caller a forwarder named by identity names (DNS SAN frontend.shop.svc) was not trusted")
	}
	if byID.Trusted(byID.Resolve(trust.Peer{Addr: stranger, ForwardedClientCert: quoted})) {
		t.Error("the same header from an unauthenticated peer was believed")
	}
	if got := (*trust.Policy)(nil).Resolve(trust.Peer{Addr: proxy, ForwardedClientCert: istioSleep}); got.Addr != proxy || got.ForwardedClientCert != "" {
		t.Errorf("a nil Policy's Resolve: %+v", got)
	}
}

// URI SANs and DNS SANs are two namespaces.
func TestURIAndDNSNamespaces(t *testing.T) {
	pol := trust.MustNew(trust.Config{Identities: []string{"frontend", "spiffe://cluster.local/ns/shop/sa/frontend"}})
	if !pol.Trusted(trust.Peer{Identities: []string{"frontend"}}) || !pol.Trusted(trust.Peer{Identities: []string{"spiffe://cluster.local/ns/shop/sa/frontend"}}) {
		t.Fatal("the configured identities are not trusted")
	}
	for _, bad := range []string{"frontend:8443", "10.0.0.1:80", " frontend", "frontend "} {
		if _, err := trust.New(trust.Config{Identities: []string{bad}}); err == nil {
			t.Errorf("identity %q accepted: neither a URI with a scheme nor a DNS name", bad)
		}
	}
	if _, err := trust.New(trust.Config{Forwarders: trust.Forwarders{Networks: []string{"127.0.0.1"}}}); err == nil || !strings.Contains(err.Error(), "forwarders") {
		t.Errorf("a malformed forwarder network: %v, want an error naming the forwarders", err)
	}
}

func FuzzLastForwardedIdentities(f *testing.F) {
	for _, s := range []string{envoyOne, envoyTwo, envoyDNS, istioSleep, quoted, `"`, `\`, `,`, `;`, `=`, `URI="a\"`, `DNS=a;DNS=b,`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, xfcc string) {
		ids := trust.LastForwardedIdentities(xfcc)
		if len(ids) > 16 {
			t.Fatalf("%d identities", len(ids))
		}
		for _, id := range ids {
			if id == "" {
				t.Fatal("an empty identity")
			}
			if _, err := trust.New(trust.Config{Identities: []string{id}}); err != nil {
				t.Fatalf("%q is not an identity a Policy can name: %v", id, err)
			}
		}
	})
}
