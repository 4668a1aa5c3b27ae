package triagehttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagehttp"
)

// A handler that copies a slow source into its response (io.Copy, which
// net/http's HTTP/1 writer takes as ReadFrom) waits on the source, not on
// its client: it must not stall, giving its slot back and going
// uncharged, while the client reads everything it is sent (issue 55).
func TestSlowSourceIsNotAWaitOnTheClient(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	ctl, err := admission.New(admission.WithClock(f), admission.WithLimits(1, 1, 1),
		admission.WithInterval(time.Hour), admission.WithMaxWait(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl), triagehttp.WithIntake(intake.WithClock(f)))
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	copying := make(chan struct{})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("start"))
		close(copying)
		io.Copy(w, pr) // the source: a pipe the test writes to
	})))
	defer srv.Close()
	done := make(chan error, 1)
	go func() {
		resp, err := http.Get(srv.URL)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	<-copying
	pw.Write([]byte("some of it")) // the client reads what comes
	for range 10 {
		f.Advance(admission.DefaultTargetDelay)
	}
	if s := ctl.Stats(); s.Stalled != 0 || s.Executing != 1 {
		t.Errorf("waiting on a slow source: stalled %d, executing %d; want the request running, not stalled", s.Stalled, s.Executing)
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
