package intake_test

import (
	"context"
	"testing"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/intake"
)

// BenchmarkClientWait is one wait on the client that does not stall
// (ClientWait, ClientResume): what each message of a stream, or each
// write of an HTTP response, costs under admission control.
func BenchmarkClientWait(b *testing.B) {
	ctl, err := admission.New()
	if err != nil {
		b.Fatal(err)
	}
	in, err := intake.New(intake.WithAdmission(ctl))
	if err != nil {
		b.Fatal(err)
	}
	h, err := in.Accept(context.Background(), &intake.Request{Path: "/svc/M"})
	if err != nil {
		b.Fatal(err)
	}
	if err := h.Start(); err != nil {
		b.Fatal(err)
	}
	defer h.Finish()
	b.ReportAllocs()
	for b.Loop() {
		h.ClientWait(intake.Own)
		h.ClientResume(intake.Own)
	}
}
