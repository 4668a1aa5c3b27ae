// Package rawgrpc is a cheap open-loop gRPC load generator: unary calls
// written as HTTP/2 frames on a few connections, without a goroutine,
// a context or a codec per call, and their statuses read from the
// trailers by one goroutine per connection. It exists so that a benchmark
// can offer a one-CPU server 20 times its capacity from one other CPU
// with margin: grpc-go's client costs about as much per call as the
// server's refusal, and a generator that falls behind its schedule
// judges itself, not the server.
//
// A Conn is safe for concurrent Send calls. It is bounded by the
// server's SETTINGS_MAX_CONCURRENT_STREAMS (a call beyond it is
// answered Unavailable by the server, as a refused stream) and by the
// calls it was made for (ids in [0, calls)).
package rawgrpc

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/triagehq/triage/internal/grpcwire"
)

// maxDetails bounds the decoded details a Conn keeps: a server answers
// with a handful of kinds; past the bound each is decoded every time.
const maxDetails = 64

// Result is one call's fate, told to the Conn's done func.
type Result struct {
	ID   int        // the id Send was given
	Code codes.Code // from grpc-status (Unavailable for a refused stream)
	Err  error      // the status as an error (nil for OK), details included
	At   time.Time  // when the answer was read
}

// Conn is one cleartext HTTP/2 connection sending unary calls.
type Conn struct {
	c       net.Conn
	method  string
	message []byte // the length-prefixed message every call sends
	done    func(Result)

	mu   sync.Mutex // serializes writes: w, fr, enc, hb, next
	w    *bufio.Writer
	fr   *http2.Framer
	enc  *hpack.Encoder
	hb   bytes.Buffer
	next uint32 // the next stream id

	ids     []atomic.Int32 // stream (id-1)/2 -> the caller's id + 1
	details sync.Map       // grpc-status-details-bin -> error, so that a repeated refusal is decoded once
	ndetail atomic.Int32   // entries in details, at most maxDetails
	closed  chan struct{}
	err     atomic.Value // the read loop's end
}

// Dial connects to addr for at most calls calls to method, each sending
// msg (a serialized protobuf); done is called once per call, from the
// connection's read goroutine, when its status is read. Close stops it.
func Dial(addr, method string, msg []byte, calls int, done func(Result)) (*Conn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	cn := &Conn{c: c, method: method, done: done, next: 1, ids: make([]atomic.Int32, calls), closed: make(chan struct{})}
	cn.message = append([]byte{0, 0, 0, 0, 0}, msg...)
	cn.message[1], cn.message[2], cn.message[3], cn.message[4] = byte(len(msg)>>24), byte(len(msg)>>16), byte(len(msg)>>8), byte(len(msg))
	cn.w = bufio.NewWriterSize(c, 64<<10)
	cn.fr = http2.NewFramer(cn.w, bufio.NewReaderSize(c, 64<<10))
	cn.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	cn.enc = hpack.NewEncoder(&cn.hb)
	if _, err := cn.w.WriteString(http2.ClientPreface); err != nil {
		c.Close()
		return nil, err
	}
	// A window the server's answers never exhaust between two updates.
	if err := errors.Join(cn.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}),
		cn.fr.WriteWindowUpdate(0, 1<<30), cn.w.Flush()); err != nil {
		c.Close()
		return nil, err
	}
	go cn.read()
	return cn, nil
}

// Send writes call id: headers (with extra, and grpc-timeout set to
// timeout), the message and END_STREAM. The frames are buffered; Flush
// sends them.
func (c *Conn) Send(id int, extra []hpack.HeaderField, timeout time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	sid := c.next
	if int(sid/2) >= len(c.ids) {
		return fmt.Errorf("rawgrpc: more than the %d calls the connection was made for", len(c.ids))
	}
	c.next += 2
	c.ids[sid/2].Store(int32(id) + 1)
	c.hb.Reset()
	for _, f := range [...]hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":authority", Value: c.c.RemoteAddr().String()}, {Name: ":path", Value: c.method},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		{Name: "grpc-timeout", Value: grpcwire.FormatTimeout(timeout)}} {
		c.enc.WriteField(f)
	}
	for _, f := range extra {
		c.enc.WriteField(f)
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: c.hb.Bytes(), EndHeaders: true}); err != nil {
		return err
	}
	return c.fr.WriteData(sid, true, c.message)
}

// Flush sends what Send buffered.
func (c *Conn) Flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.w.Flush()
}

// Close closes the connection; calls not yet answered are not reported.
func (c *Conn) Close() error {
	err := c.c.Close()
	<-c.closed
	return err
}

// Err is why the read loop ended (nil while it runs).
func (c *Conn) Err() error {
	if e, ok := c.err.Load().(error); ok {
		return e
	}
	return nil
}

// read reads frames until the connection ends: answers SETTINGS and
// PING, reports each call at its trailers (or its RST_STREAM), and
// replenishes the connection's window.
func (c *Conn) read() {
	defer close(c.closed)
	var received uint32
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.err.Store(err)
			return
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				c.report(f.StreamID, f.Fields)
			}
		case *http2.RSTStreamFrame:
			c.finish(f.StreamID, codes.Unavailable, status.Error(codes.Unavailable, "rawgrpc: stream reset: "+f.ErrCode.String()))
		case *http2.DataFrame:
			if received += uint32(f.Length); received > 1<<28 {
				c.write(func() error { return c.fr.WriteWindowUpdate(0, received) })
				received = 0
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.write(func() error { return c.fr.WriteSettingsAck() })
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				c.write(func() error { return c.fr.WritePing(true, f.Data) })
			}
		case *http2.GoAwayFrame:
			c.err.Store(fmt.Errorf("rawgrpc: GOAWAY %v", f.ErrCode))
		}
	}
}

// write writes a control frame and flushes.
func (c *Conn) write(f func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f() == nil {
		c.w.Flush()
	}
}

// report reports the call of stream sid from its trailers (or a
// trailers-only answer).
func (c *Conn) report(sid uint32, fields []hpack.HeaderField) {
	code, msg, details := codes.Unknown, "", ""
	for _, f := range fields {
		switch f.Name {
		case "grpc-status":
			if n, err := strconv.Atoi(f.Value); err == nil {
				code = codes.Code(n)
			}
		case "grpc-message":
			msg = f.Value
		case "grpc-status-details-bin":
			details = f.Value
		}
	}
	if code == codes.OK {
		c.finish(sid, code, nil)
		return
	}
	c.finish(sid, code, c.statusErr(code, msg, details))
}

// statusErr is the call's status as grpc-go's client would give it,
// details included; a details value is decoded once per connection.
func (c *Conn) statusErr(code codes.Code, msg, details string) error {
	if details == "" {
		return status.Error(code, msg)
	}
	if e, ok := c.details.Load(details); ok {
		return e.(error)
	}
	b, err := base64.RawStdEncoding.DecodeString(details)
	if err != nil {
		b, err = base64.StdEncoding.DecodeString(details)
	}
	p := new(spb.Status)
	if err != nil || proto.Unmarshal(b, p) != nil {
		return status.Error(code, msg)
	}
	e := status.FromProto(p).Err()
	if c.ndetail.Add(1) <= maxDetails {
		c.details.Store(details, e)
	}
	return e
}

// finish tells done of stream sid's call, once.
func (c *Conn) finish(sid uint32, code codes.Code, err error) {
	if sid == 0 || int(sid/2) >= len(c.ids) {
		return
	}
	id := c.ids[sid/2].Swap(0)
	if id == 0 {
		return
	}
	c.done(Result{ID: int(id) - 1, Code: code, Err: err, At: time.Now()})
}
