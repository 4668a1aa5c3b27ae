package loadtest

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/triagehq/triage/internal/hostport"
)

// CheckLoopback returns nil when every address hostPort's host stands
// for is a loopback address (127.0.0.0/8, ::1), and an error naming the
// first that is not, or the lookup's error, otherwise. A load test sent
// off this machine by mistake is an attack on somebody; callers that mean
// it skip the check.
func CheckLoopback(ctx context.Context, hostPort string) error {
	host := hostport.Host(hostPort)
	if host == "" {
		return fmt.Errorf("loadtest: no host in %q", hostPort)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !a.Unmap().IsLoopback() {
			return fmt.Errorf("loadtest: %s is not a loopback address; a load test goes off this machine only when told to", host)
		}
		return nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("loadtest: %w", err)
	}
	if len(addrs) == 0 {
		return fmt.Errorf("loadtest: %s has no address", host)
	}
	for _, a := range addrs {
		if !a.Unmap().IsLoopback() {
			return fmt.Errorf("loadtest: %s resolves to %s, not a loopback address; a load test goes off this machine only when told to", host, a)
		}
	}
	return nil
}
