// Package loopback makes clients that dial from a chosen loopback source
// address (127.0.0.2, 127.0.0.3, ...), so tests and the demo can play trusted
// and untrusted peers on one machine.
package loopback

import (
	"net"
	"net/http"
	"time"
)

// Dialer dials from source IP ip.
func Dialer(ip string, timeout time.Duration) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: timeout}
}

// HTTPClient returns an HTTP client whose connections come from ip.
func HTTPClient(ip string, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: Dialer(ip, timeout).DialContext, MaxIdleConnsPerHost: 4}}
}
