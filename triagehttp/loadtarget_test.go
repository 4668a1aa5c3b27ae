package triagehttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/loadtest"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagehttp"
)

func TestLoadTargetOverLoopback(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.Method+" "+string(body)+" "+r.Header.Get("Triage-Criticality")+" "+r.Header.Get("X-Team"))
		mu.Unlock()
		switch r.URL.Path {
		case "/ok":
			w.Write([]byte("fine"))
		case "/shed":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/triage-shed": // as triagehttp's middleware refuses
			triagehttp.WriteError(w, outcome.New(outcome.TaskOverloaded, "queue"))
		case "/quota":
			w.WriteHeader(http.StatusTooManyRequests)
		case "/slow":
			<-r.Context().Done()
		case "/gateway":
			w.WriteHeader(http.StatusGatewayTimeout)
		default:
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	caller, err := egress.New(egress.WithoutPolicy(), egress.WithInternal(u.Host))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &triagehttp.Transport{Caller: caller}}
	for path, want := range map[string]loadtest.Outcome{
		"/ok": loadtest.OK, "/shed": loadtest.Overloaded, "/triage-shed": loadtest.Overloaded, "/quota": loadtest.Overloaded,
		"/slow": loadtest.DeadlineExceeded, "/gateway": loadtest.DeadlineExceeded, "/bad": loadtest.Failed,
	} {
		target, err := triagehttp.NewLoadTarget(client, http.MethodPost, srv.URL+path, []byte("body"), http.Header{"X-Team": {"pay"}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(criticality.NewContext(context.Background(), criticality.CriticalPlus), 300*time.Millisecond)
		got := target.Call(ctx)
		cancel()
		if got != want {
			t.Errorf("%s: %v, want %v", path, got, want)
		}
	}
	mu.Lock()
	for _, s := range seen {
		if s != "POST body CRITICAL_PLUS pay" {
			t.Errorf("server saw %q, want the method, body, criticality and header", s)
		}
	}
	mu.Unlock()
	for _, bad := range []string{"ftp://127.0.0.1/", "127.0.0.1:80", "http://", "http://[::1"} {
		if _, err := triagehttp.NewLoadTarget(nil, "", bad, nil, nil); err == nil {
			t.Errorf("NewLoadTarget(%q) accepted", bad)
		}
	}
	if _, err := triagehttp.NewLoadTarget(nil, "BAD METHOD", srv.URL, nil, nil); err == nil {
		t.Error("a method with a space was accepted")
	}
}

// Issue 38: a load target that answers with a redirect does not lead the
// load elsewhere: the redirect is counted, not followed, whatever the
// client's own CheckRedirect says.
func TestLoadTargetDoesNotFollowRedirects(t *testing.T) {
	var elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	defer other.Close()
	target := httptest.NewServer(http.RedirectHandler(other.URL+"/", http.StatusFound))
	defer target.Close()
	follows := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}
	for _, client := range []*http.Client{nil, follows} {
		tg, err := triagehttp.NewLoadTarget(client, "GET", target.URL, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := tg.Call(context.Background()); got != loadtest.Redirected {
			t.Errorf("a 302: %v, want %v", got, loadtest.Redirected)
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirect was followed: %d requests reached the other host", n)
	}
}
