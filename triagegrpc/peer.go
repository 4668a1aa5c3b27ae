package triagegrpc

import (
	"context"
	"net"
	"net/netip"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/triagehq/triage/trust"
)

// PeerOf returns what the transport knows about the caller: its IP address
// and, for TLS connections whose client certificate was verified, the
// certificate's URI and DNS SANs. An unverified certificate yields no
// identity.
func PeerOf(ctx context.Context) trust.Peer {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return trust.Peer{}
	}
	var tp trust.Peer
	switch a := p.Addr.(type) {
	case *net.TCPAddr:
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			tp.Addr = ip.Unmap()
		}
	case nil:
	default:
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			tp.Addr = ap.Addr().Unmap()
		}
	}
	if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
		tp.Identities = trust.Identities(&info.State)
	}
	return tp
}
