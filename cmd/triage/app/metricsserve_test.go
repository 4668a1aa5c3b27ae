package app

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The metrics and probe listener faces whoever reaches the node: a peer
// holding connections open takes at most metricsLimits.conns of them, and
// a scraper still gets through once one is given back (issue 55: no
// bound at all).
func TestMetricsListenerBoundsItsPeers(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	stop, err := serveMetrics(addr, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	var held []net.Conn
	for range metricsLimits.conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		// One scrape on it, so that it is surely accepted; then it idles.
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	client := &http.Client{Timeout: 300 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := client.Get("http://" + addr + "/"); err == nil {
		resp.Body.Close()
		t.Fatalf("a %dth connection was served while %d were held", metricsLimits.conns+1, metricsLimits.conns)
	}
	held[0].Close()
	held = held[1:]
	client.Timeout = 10 * time.Second
	resp, err := client.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("a scraper after one connection was given back: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("scrape: %d", resp.StatusCode)
	}
}
