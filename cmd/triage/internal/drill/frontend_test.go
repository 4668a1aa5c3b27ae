package drill

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triagehq/triage/internal/testkit/relay"
)

// The protected frontend holds at most MaxConns connections open: the
// next client's request waits in the accept queue, unanswered, until one
// of them closes, and is then served. (bench/cmd/frontendload measures
// what that bound is for: 4,000 wrk connections.)
func TestProtectedFrontendBoundsItsConnections(t *testing.T) {
	a := grpc.NewServer()
	relay.RegisterFunc(a, func(context.Context, string) (string, error) { return "full", nil })
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go a.Serve(aln)
	defer a.Stop()
	next, err := grpc.NewClient("passthrough:///"+aln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()

	const maxConns = 2
	tk := &task{cfg: Task{Role: RoleFrontend, Protect: true, MaxConns: maxConns, MemLimit: 64 * RequestMemory},
		mach: newMachine(1, 0), rejected: map[string]int64{}, died: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop, err := tk.serveFrontend(ln, next)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	// get sends one request on c and reads its answer within d.
	get := func(c net.Conn, d time.Duration) (*http.Response, error) {
		fmt.Fprintf(c, "GET /search HTTP/1.1\r\nHost: x\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(d))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}
	var open []net.Conn
	for i := 0; i < maxConns; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if resp, err := get(c, 10*time.Second); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("connection %d: %v, %v", i, resp, err)
		}
		open = append(open, c)
	}
	over, err := net.Dial("tcp", ln.Addr().String()) // the kernel completes the handshake
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	if resp, err := get(over, 300*time.Millisecond); err == nil {
		t.Fatalf("connection %d answered (%d) while %d were open", maxConns+1, resp.StatusCode, maxConns)
	}
	open[0].Close()
	over.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(over), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("connection %d after one closed: %v, %v", maxConns+1, resp, err)
	}
	resp.Body.Close()
}
