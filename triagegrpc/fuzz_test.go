package triagegrpc_test

import (
	"context"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/wire"
)

// FuzzFromStatus feeds arbitrary bytes as the grpc-status-details-bin
// trailer (a serialized google.rpc.Status) to the outcome decoder, which
// reads its details or, without details, its code and message.
func FuzzFromStatus(f *testing.F) {
	for _, e := range []*outcome.Error{
		outcome.New(outcome.TaskOverloaded, "cpu"),
		{Kind: outcome.OutOfQuota, RetryAfter: 3 * time.Second},
		{Kind: outcome.DontRetry, RetryAfter: -time.Second},
	} {
		b, _ := proto.Marshal(triagegrpc.Status(e).Proto())
		f.Add(b)
		// The compact form: code and message only.
		b, _ = proto.Marshal(status.New(triagegrpc.Code(e.Kind), e.Error()).Proto())
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte("\x08\x0e\x12\x02hi\x1a\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p spb.Status
		if proto.Unmarshal(b, &p) != nil {
			return
		}
		oe, ok := triagegrpc.FromStatus(status.FromProto(&p))
		if !ok {
			return
		}
		if !oe.Kind.Overload() || !oe.Downstream {
			t.Fatalf("decoded %+v", oe)
		}
		if oe.RetryAfter < 0 || oe.RetryAfter > outcome.MaxRetryAfter {
			t.Fatalf("RetryAfter %v out of range", oe.RetryAfter)
		}
		if len(oe.Reason) > 128 {
			t.Fatalf("reason of %d bytes", len(oe.Reason))
		}
	})
}

// FuzzServerMetadata runs the server interceptor on arbitrary inbound
// metadata values for triage's keys, repeated or not.
func FuzzServerMetadata(f *testing.F) {
	f.Add("CRITICAL_PLUS", "1", "", false)
	f.Add("SHEDDABLE", "99", "SHEDDABLE", true)
	f.Add("\xff\xfe", "-3", "x", false)
	f.Add("CRITICAL", "", "", true)
	srv, err := triagegrpc.NewServer()
	if err != nil {
		f.Fatal(err)
	}
	icpt := srv.UnaryInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/svc/M"}
	f.Fuzz(func(t *testing.T, crit, att, extra string, repeat bool) {
		md := metadata.Pairs(wire.CriticalityKey, crit, wire.AttemptKey, att)
		if repeat {
			md.Append(wire.CriticalityKey, extra)
		}
		ctx := metadata.NewIncomingContext(context.Background(), md)
		_, err := icpt(ctx, nil, info, func(ctx context.Context, _ any) (any, error) {
			if l := criticality.Of(ctx); l != criticality.Default {
				// No trust policy: nothing the caller sent is believed.
				t.Fatalf("untrusted caller set %v", l)
			}
			if n := attempt.Incoming(ctx); n != 0 {
				t.Fatalf("untrusted caller set attempt %d", n)
			}
			return nil, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}
