package loopback

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/loadtest"
	"github.com/triagehq/triage/triagehttp"
)

// Shot is one request of an open-loop schedule: what to send, and when
// from the start.
type Shot struct {
	Key string
	At  time.Duration
}

// Schedule is an open-loop load: requests at fixed rates over intervals.
// Its length is what bounds the goroutines Run starts.
type Schedule []Shot

// Add sends key at rate per second from from to to.
func (s *Schedule) Add(key string, rate float64, from, to time.Duration) {
	for at := from; at < to; at += time.Duration(float64(time.Second) / rate) {
		*s = append(*s, Shot{key, at})
	}
}

// Run fires every shot at its time and waits for all of them: fire runs
// on the pacing goroutine, with the time elapsed, and returns the request,
// which runs in a goroutine of its own (their count is bounded by the
// schedule).
func (s Schedule) Run(fire func(el time.Duration, sh Shot) func()) {
	sort.SliceStable(s, func(i, j int) bool { return s[i].At < s[j].At })
	at := func(i int) (time.Duration, bool) {
		if i == len(s) {
			return 0, false
		}
		return s[i].At, true
	}
	loadtest.OpenLoop{}.Run(context.Background(), at, func(i int, lag time.Duration) func() {
		return fire(s[i].At+lag, s[i])
	})
}

// RelayFrontend serves an HTTP frontend on loopback behind mw: each
// request is relayed over cc with the body body(r), within timeout (0:
// none), and answered 200, or the overload outcome. It returns the base
// URL and a client with room for thousands of connections.
func RelayFrontend(t testing.TB, mw func(http.Handler) http.Handler, cc grpc.ClientConnInterface, timeout time.Duration, body func(*http.Request) string) (string, *http.Client) {
	t.Helper()
	front := &http.Server{Handler: mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		if _, err := relay.Invoke(ctx, cc, body(r)); err != nil {
			if !triagehttp.WriteError(w, err) {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			return
		}
		w.WriteHeader(http.StatusOK)
	}))}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go front.Serve(ln)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2000}, Timeout: 30 * time.Second}
	t.Cleanup(func() {
		front.Close()
		hc.CloseIdleConnections()
	})
	return "http://" + ln.Addr().String(), hc
}

// FreeAddr returns a loopback address free now for a child process to
// listen on. Its port is below the kernel's ephemeral range (32768 and
// up on Linux), so that no outgoing connection of the test's processes
// can take it before the child listens, and it is never one FreeAddr
// returned before in this process: two addresses picked for one child
// (a replica's gRPC and metrics ports) cannot be the same port. Test
// binaries that run at once draw from 12,000 ports, at random.
func FreeAddr(t testing.TB) string {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 1000 {
		port := 20000 + rand.IntN(12000)
		if handedOut.ports[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		handedOut.ports[port] = true
		return l.Addr().String()
	}
	t.Fatal("no free port below the ephemeral range")
	return ""
}

// handedOut is the ports FreeAddr returned: a few dozen a test binary.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// ListenRetry listens on addr, trying again for up to 2 s while the
// address is still taken (a child process that has just exited, a port
// FreeAddr handed out that another binary's connection holds a moment).
func ListenRetry(addr string) (net.Listener, error) {
	var err error
	for range 200 {
		var lis net.Listener
		if lis, err = net.Listen("tcp", addr); err == nil {
			return lis, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil, err
}
