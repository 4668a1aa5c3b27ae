// Package loopback makes clients that dial from a chosen loopback source
// address (127.0.0.2, 127.0.0.3, ...), so tests and the demo can play trusted
// and untrusted peers on one machine.
package loopback

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/triagegrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Dialer dials from source IP ip.
func Dialer(ip string, timeout time.Duration) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: timeout}
}

// HTTPClient returns an HTTP client whose connections come from ip.
func HTTPClient(ip string, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: Dialer(ip, timeout).DialContext, MaxIdleConnsPerHost: 4}}
}

// ServeGRPC serves s on a loopback port until the test ends and returns
// the address.
func ServeGRPC(tb testing.TB, s *grpc.Server) string {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go s.Serve(lis)
	tb.Cleanup(s.Stop)
	return lis.Addr().String()
}

// DialGRPC dials addr without TLS; the connection closes with the test.
func DialGRPC(tb testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	tb.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cc.Close() })
	return cc
}

// WaitFor polls cond every millisecond until it holds, for at most ten
// seconds, and fails the test otherwise: for tests that watch a real
// server over sockets, whose state changes on its own goroutines.
func WaitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Hosts are the loopback hosts tests dial: the internal hosts of Caller.
var Hosts = []string{"127.0.0.1", "::1", "localhost"}

// Caller returns an egress.Caller made with opts that sends triage's keys
// to the loopback hosts; it fails the test on an error.
func Caller(tb testing.TB, opts ...egress.Option) *egress.Caller {
	tb.Helper()
	c, err := egress.New(append([]egress.Option{egress.WithInternal(Hosts...)}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// Client returns the triagegrpc.Client of Caller(tb, opts...).
func Client(tb testing.TB, opts ...egress.Option) *triagegrpc.Client {
	tb.Helper()
	c, err := triagegrpc.NewClient(Caller(tb, opts...))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}
