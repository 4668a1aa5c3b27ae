package admission_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/triagehttp"
)

// A backend protected by admission control. No limit is configured: the
// controller finds how many requests to admit from the time they wait
// before their handler starts and from their service time; when the task
// is full it refuses SHEDDABLE work first and answers 503 with
// Triage-Outcome: task-overloaded. On gRPC, pass the Controller to
// triagegrpc.WithIntake(intake.WithAdmission) instead: it then decides in the tap handle,
// before a goroutine exists.
func Example() {
	ctl, err := admission.New()
	if err != nil {
		panic(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl))
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ctl.Degrade(0) {
			fmt.Fprint(w, "a cheaper answer")
			return
		}
		fmt.Fprint(w, "the full answer")
	})))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, ctl.Stats().Pending)
	// Output: 200 0
}
