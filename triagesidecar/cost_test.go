package triagesidecar_test

import (
	"io"
	"math"
	"net/http"
	"runtime"
	"testing"

	"github.com/triagehq/triage/triagesidecar"
)

// Forwarding a request allocates what the request needs, not a copy
// buffer of its own: the upstream's answer is copied through pooled
// buffers. httputil.ReverseProxy without a BufferPool allocates 32 KiB
// for every request it forwards; at 12,000 forwarded a second the
// sidecar's allocator and collector took a quarter of its CPU
// (bench/cmd/proxycpu, docs/sidecar.md).
func TestForwardingAllocatesNoCopyBuffer(t *testing.T) {
	ok := []byte("ok\n")
	up := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(ok) }))
	h, err := triagesidecar.Ingress(mustURL(t, "http://"+up))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, h)
	tr := &http.Transport{MaxIdleConnsPerHost: 1}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	// bytes returns what n requests to addr allocate in this process,
	// per request, after a warm-up (connections, pools).
	bytes := func(addr string, n int) uint64 {
		get := func() {
			resp, err := client.Get("http://" + addr + "/")
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
		for range 50 {
			get()
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range n {
			get()
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / uint64(n)
	}
	// The sidecar's own, over what the client and the upstream allocate
	// for a request sent straight to the upstream; the least of three
	// readings, since whatever else runs in the process only adds. Under
	// the race detector sync.Pool drops a quarter of what it is given,
	// so a buffer is allocated for about one request in four there.
	own := int64(math.MaxInt64)
	for range 3 {
		direct, through := bytes(up, 400), bytes(addr, 400)
		own = min(own, int64(through)-int64(direct))
		t.Logf("bytes allocated per request: %d straight to the upstream, %d through the sidecar", direct, through)
	}
	if own >= 24<<10 {
		t.Errorf("the sidecar allocates %d bytes per forwarded request, want < 24 KiB (a 32 KiB copy buffer each?)", own)
	}
}
