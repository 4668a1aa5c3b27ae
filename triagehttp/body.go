package triagehttp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/triagehq/triage/internal/grpcwire"
	"github.com/triagehq/triage/wire"
)

// guardTrailers has r's body remove the triage keys from r's trailers
// when it ends, before the handler or a proxy behind it can read them:
// triage's keys travel in headers only, whoever sends them. Only a body
// that can end in trailers is wrapped (HTTP/1.1 chunked, HTTP/2).
func guardTrailers(r *http.Request) {
	if hasBody(r) && (r.ProtoMajor >= 2 || len(r.TransferEncoding) > 0) {
		r.Body = &trailerGuard{ReadCloser: r.Body, r: r}
	}
}

// trailerGuard is a request body that removes the triage keys from its
// request's trailers at its end (guardTrailers).
type trailerGuard struct {
	io.ReadCloser
	r *http.Request
}

func (b *trailerGuard) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		for k := range b.r.Trailer {
			if wire.IsTriage(k) {
				delete(b.r.Trailer, k)
			}
		}
	}
	return n, err
}

// hasBody says whether r has a body to read.
func hasBody(r *http.Request) bool {
	return r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
}

// readAhead is a body's read-ahead (WithBodyBuffer, WithBodyTimeout):
// the zero durations wait as long as the body takes.
type readAhead struct {
	limit        int
	firstMessage time.Duration // a gRPC request's wait for its first message
	body         time.Duration // WithBodyTimeout
	minRate      int
}

// read reads up to ra.limit of r's body ahead and puts it back in front
// of the rest; whole says it read the body to its end, arrived that what
// it waited for came (false for a gRPC request that goes on without its
// first message). A gRPC request's first message is waited for at most
// ra.firstMessage (readFirstMessage).
// Any other body may take ra.body, and a second more for every
// ra.minRate bytes that came (pacedBody): past that, the error is
// os.ErrDeadlineExceeded, answered 408 by the caller. Any other read
// error is left for the handler, as without triage. The read deadline is
// the connection's (http.ResponseController); afterwards the server's
// ReadTimeout, if it has one, holds again from when the request came in.
func (ra readAhead) read(w http.ResponseWriter, r *http.Request) (whole, arrived bool, err error) {
	grpc := grpcwire.IsGRPC(r.Header.Get("Content-Type"))
	if grpc && ra.firstMessage > 0 {
		whole, arrived = readFirstMessage(r, ra.limit, ra.firstMessage)
		return whole, arrived, nil
	}
	start := time.Now()
	rc := http.NewResponseController(w)
	var body io.Reader = r.Body
	deadlines := ra.body > 0 && rc.SetReadDeadline(start.Add(ra.body)) == nil
	if deadlines && ra.minRate > 0 {
		body = &pacedBody{Reader: r.Body, rc: rc, by: start.Add(ra.body), minRate: ra.minRate}
	}
	head, whole, err := readHead(body, grpc, ra.limit)
	if deadlines {
		var restore time.Time
		if srv, _ := r.Context().Value(http.ServerContextKey).(*http.Server); srv != nil && srv.ReadTimeout > 0 {
			restore = start.Add(srv.ReadTimeout)
		}
		rc.SetReadDeadline(restore)
	}
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false, false, err
	case err != nil:
		// Any other error (a body over http.MaxBytesReader's limit, a
		// malformed chunk, a client gone) is the handler's to answer, as
		// without triage: its body reads what came, then the error.
		r.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(head), errReader{err}), body: r.Body}
		return true, true, nil
	case whole:
		r.Body = &prefixedBody{Reader: bytes.NewReader(head), body: r.Body}
		return true, true, nil
	}
	r.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(head), r.Body), body: r.Body}
	return false, true, nil
}

// pacedBody moves a body's read deadline on by a second for every
// minRate bytes that come (Apache's mod_reqtimeout MinRate): a body that
// keeps coming at that rate is never cut off, one that stops is.
type pacedBody struct {
	io.Reader
	rc      *http.ResponseController
	by      time.Time // the deadline before any byte came
	minRate int
	n       int64
}

func (p *pacedBody) Read(b []byte) (int, error) {
	n, err := p.Reader.Read(b)
	if n > 0 {
		p.n += int64(n)
		p.rc.SetReadDeadline(p.by.Add(time.Duration(p.n) * time.Second / time.Duration(p.minRate)))
	}
	return n, err
}

// readFirstMessage waits up to wait for a gRPC request's first message
// (readHead), and puts what it read back in front of the rest of the
// body; whole says the body ended with it. A stream whose server speaks
// first sends nothing until it has heard from the server, so past wait
// the request goes on without its message: its body's reads then wait
// for the one under way, as waits on the client (onClient), and arrived
// is false. Half the message timeout, so that Start does not refuse the
// request as late.
func readFirstMessage(r *http.Request, limit int, wait time.Duration) (whole, arrived bool) {
	body := r.Body
	done := make(chan headRead, 1)
	go func() {
		var h headRead
		h.head, h.whole, h.err = readHead(body, true, limit)
		done <- h
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case h := <-done:
		r.Body = h.body(body)
		return h.whole || h.err != nil, true
	case <-t.C:
		r.Body = &pendingBody{done: done, body: body}
		return false, false
	}
}

// headRead is what readHead returned.
type headRead struct {
	head  []byte
	whole bool
	err   error
}

// body is the request's body with h put back in front of rest.
func (h headRead) body(rest io.ReadCloser) io.ReadCloser {
	switch {
	case h.err != nil:
		return &prefixedBody{Reader: io.MultiReader(bytes.NewReader(h.head), errReader{h.err}), body: rest}
	case h.whole:
		return &prefixedBody{Reader: bytes.NewReader(h.head), body: rest}
	}
	return &prefixedBody{Reader: io.MultiReader(bytes.NewReader(h.head), rest), body: rest}
}

// pendingBody is a body whose first message is still being read
// (readFirstMessage): its first Read waits for it. Close closes the body,
// which ends that read.
type pendingBody struct {
	done <-chan headRead
	body io.ReadCloser
	r    io.Reader // once the first message is in
}

func (b *pendingBody) Read(p []byte) (int, error) {
	if b.r == nil {
		b.r = (<-b.done).body(b.body)
	}
	return b.r.Read(p)
}

func (b *pendingBody) Close() error { return b.body.Close() }

// readHead reads the start of body: up to limit bytes, or for a gRPC
// request its first length-prefixed message if it fits, since a stream's
// later messages may wait for the server's answers. whole says the body
// ended.
func readHead(body io.Reader, grpc bool, limit int) (head []byte, whole bool, err error) {
	if !grpc || limit < 5 {
		head, err = io.ReadAll(io.LimitReader(body, int64(limit)))
		return head, err == nil && len(head) < limit, err
	}
	var prefix [5]byte
	n, err := io.ReadFull(body, prefix[:])
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return prefix[:n], true, nil // the handler sees the short body as it is
	}
	if err != nil {
		return prefix[:n], false, err
	}
	size := binary.BigEndian.Uint32(prefix[1:])
	if uint64(size) > uint64(limit-5) {
		return prefix[:], false, nil // the rest streams in under the handler
	}
	head = make([]byte, 5+int(size))
	copy(head, prefix[:])
	n, err = io.ReadFull(body, head[5:])
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return head[:5+n], true, nil
	}
	return head[:5+n], false, err
}

// slowBody answers a request whose body did not come within the message
// timeout: 408. Over HTTP/1.1 the connection closes, since the rest of
// the body would be read as the next request; over HTTP/2 only the
// stream ends, since net/http would close a connection other callers
// share (GOAWAY) for a Connection: close.
func slowBody(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor < 2 {
		w.Header().Set("Connection", "close")
	}
	w.WriteHeader(http.StatusRequestTimeout)
}

// errReader returns its error.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// prefixedBody is a body whose first bytes were read ahead.
type prefixedBody struct {
	io.Reader
	body io.ReadCloser
}

func (b *prefixedBody) Close() error { return b.body.Close() }
