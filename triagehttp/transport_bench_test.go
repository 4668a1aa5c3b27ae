package triagehttp_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/triagehttp"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// BenchmarkTransport measures the Transport's own work on one request to
// an internal host, against a base RoundTripper that answers at once:
// /propagate without a policy, /policy with the book's.
func BenchmarkTransport(b *testing.B) {
	var seen string
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		seen = r.Header.Get("Triage-Criticality")
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(""))}, nil
	})
	p, err := retry.New()
	if err != nil {
		b.Fatal(err)
	}
	ctx := criticality.NewContext(context.Background(), criticality.SheddablePlus)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.internal/x", nil)
	for _, bc := range []struct {
		name string
		opts []egress.Option
	}{
		{"propagate", []egress.Option{egress.WithoutPolicy()}},
		{"policy", []egress.Option{egress.WithPolicy(p)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			caller, err := egress.New(append(bc.opts, egress.WithInternal("api.internal"))...)
			if err != nil {
				b.Fatal(err)
			}
			tr := &triagehttp.Transport{Base: base, Caller: caller}
			b.ReportAllocs()
			for b.Loop() {
				resp, err := tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
			if seen != "SHEDDABLE_PLUS" {
				b.Fatalf("the base saw criticality %q", seen)
			}
		})
	}
}
