package triagehttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/triagehttp"
)

// A handler waiting on a call through triage's Transport gives up its
// execution slot meanwhile: with an execution limit of one, four requests
// in flight at once all reach the downstream, which answers only when all
// four have arrived.
func TestHandlersWaitingDownstreamHoldNoSlot(t *testing.T) {
	const n = 4
	var arrived sync.WaitGroup
	arrived.Add(n)
	all := make(chan struct{})
	var once sync.Once
	go func() { arrived.Wait(); once.Do(func() { close(all) }) }()
	defer once.Do(func() { close(all) })
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Done()
		select {
		case <-all:
		case <-r.Context().Done():
		}
	}))
	defer down.Close()
	client := &http.Client{Transport: &triagehttp.Transport{}}
	ctl, err := admission.New(admission.WithLimits(1, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl))
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), "GET", down.URL, nil)
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		resp.Body.Close()
	})))
	defer front.Close()
	codes := make(chan int, n)
	for range n {
		go func() {
			c := &http.Client{Timeout: 10 * time.Second}
			resp, err := c.Get(front.URL)
			if err != nil {
				codes <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	for i := range n {
		if c := <-codes; c != http.StatusOK {
			t.Errorf("request %d: status %d", i, c)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		s := ctl.Stats()
		if s.Executing == 0 && s.Away == 0 && s.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the requests: %+v", s)
		}
		time.Sleep(time.Millisecond) // polling a real server over sockets
	}
}
