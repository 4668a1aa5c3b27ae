package triagegrpc_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/internal/testkit/loopback"
)

// A handler that forwards its incoming metadata, or copies triage keys
// into its outgoing metadata, forwards none of them: the Client sends
// only the triage keys of the call's context, whatever their name.
func TestClientDropsEveryForwardedTriageKey(t *testing.T) {
	got := make(chan metadata.MD, 1)
	gs := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		var in emptypb.Empty
		if err := ss.RecvMsg(&in); err != nil {
			return err
		}
		md, _ := metadata.FromIncomingContext(ss.Context())
		got <- md
		return ss.SendMsg(&emptypb.Empty{})
	}))
	c := loopback.Client(t, egress.WithoutPolicy())
	cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, gs), c.DialOptions()...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = criticality.NewContext(ctx, criticality.SheddablePlus)
	ctx = metadata.NewOutgoingContext(ctx, metadata.Pairs(
		"triage-criticality", "CRITICAL_PLUS", "triage-lame-duck", "1", "triage-outcome", "x",
		"triage-something-new", "y", "x-kept", "z"))
	ctx = metadata.AppendToOutgoingContext(ctx, "Triage-Customer", "acme", "TRIAGE-ATTEMPT", "2")
	if err := cc.Invoke(ctx, "/svc/M", &emptypb.Empty{}, &emptypb.Empty{}); err != nil {
		t.Fatal(err)
	}
	md := <-got
	var triage []string
	for k := range md {
		if strings.HasPrefix(k, "triage-") {
			triage = append(triage, k)
		}
	}
	slices.Sort(triage)
	if !slices.Equal(triage, []string{"triage-criticality"}) || !slices.Equal(md.Get("triage-criticality"), []string{"SHEDDABLE_PLUS"}) {
		t.Errorf("the backend received triage keys %v (criticality %v), want only triage-criticality: SHEDDABLE_PLUS", triage, md.Get("triage-criticality"))
	}
	if !slices.Equal(md.Get("x-kept"), []string{"z"}) {
		t.Errorf("x-kept = %v, want [z]: other keys travel on", md.Get("x-kept"))
	}

	// Only keys the client does not set itself.
	ctx = metadata.NewOutgoingContext(ctx, metadata.Pairs("triage-criticality-decay", "100:SHEDDABLE", "triage-something-new", "y"))
	ctx = metadata.AppendToOutgoingContext(ctx, "triage-lame-duck", "1")
	if err := cc.Invoke(ctx, "/svc/M", &emptypb.Empty{}, &emptypb.Empty{}); err != nil {
		t.Fatal(err)
	}
	md = <-got
	for k := range md {
		if strings.HasPrefix(k, "triage-") && k != "triage-criticality" {
			t.Errorf("the backend received the forwarded %s: %v", k, md[k])
		}
	}
}
