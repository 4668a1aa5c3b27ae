package triageextproc

import (
	"context"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/trust"
)

// FuzzRequestHeaders feeds the processor request-headers messages as
// Envoy (or anyone who can open a stream) might send them: it answers
// each with a decision or a clear error, never a panic, and a request it
// admits can be finished.
func FuzzRequestHeaders(f *testing.F) {
	attrs, _ := structpb.NewStruct(map[string]any{SourceAddressAttribute: "127.0.0.1:9", PeerURISANAttribute: "spiffe://x/y"})
	for _, hs := range [][]*corev3.HeaderValue{
		{{Key: ":path", RawValue: []byte("/a?b")}, {Key: ":authority", Value: "shop"}, {Key: "triage-criticality", RawValue: []byte("SHEDDABLE")}},
		{{Key: "content-type", RawValue: []byte("application/grpc")}, {Key: "grpc-timeout", RawValue: []byte("99999999H")}},
		{{Key: "triage-criticality-decay", RawValue: []byte("1850:SHEDDABLE")}, {Key: "triage-attempt", RawValue: []byte("7")}, {Key: "Triage_Customer", Value: "x"}},
	} {
		b, err := proto.Marshal(&extprocv3.ProcessingRequest{
			Attributes: map[string]*structpb.Struct{"envoy.filters.http.ext_proc": attrs},
			Request:    &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}},
		})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	ctl, err := admission.New()
	if err != nil {
		f.Fatal(err)
	}
	s, err := New(intake.WithAdmission(ctl), intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.0/8"}})))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req extprocv3.ProcessingRequest
		if proto.Unmarshal(b, &req) != nil || req.GetRequestHeaders() == nil {
			return
		}
		resp, h, refused, err := s.requestHeaders(context.Background(), &req, req.GetRequestHeaders())
		switch {
		case err != nil:
			if h != nil || resp != nil {
				t.Fatalf("an error (%v) with a decision", err)
			}
		case resp == nil:
			t.Fatal("no error and no answer")
		case refused != (resp.GetImmediateResponse() != nil):
			t.Fatalf("refused %v, answer %v", refused, resp)
		}
		if h != nil {
			h.Finish()
		}
	})
}
