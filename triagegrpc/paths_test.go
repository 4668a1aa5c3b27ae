package triagegrpc_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
	"github.com/triagehq/triage/wire"
)

// Users who cannot give up their own tap handle install only the
// interceptors; users who build dial options themselves install only the
// standalone client interceptors. Both paths must behave like the full
// installation.
func TestInterceptorOnlyPaths(t *testing.T) {
	for _, trusted := range []bool{true, false} {
		nets := []string{"192.0.2.0/24"}
		if trusted {
			nets = []string{"127.0.0.1/32"}
		}
		srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: nets}))))
		if err != nil {
			t.Fatal(err)
		}
		var sawKeys []string
		tier := &relay.Tier{Name: "S", Fail: func(ctx context.Context, _ string) error {
			md, _ := metadata.FromIncomingContext(ctx)
			sawKeys = sawKeys[:0]
			for k := range md {
				if wire.IsTriage(k) {
					sawKeys = append(sawKeys, k)
				}
			}
			return nil
		}}
		s := grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryInterceptor()), grpc.ChainStreamInterceptor(srv.StreamInterceptor()))
		relay.Register(s, tier)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go s.Serve(lis)
		c := loopback.Client(t, egress.WithoutPolicy())
		cc, err := grpc.NewClient(lis.Addr().String(), append(c.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		ctx := criticality.NewContext(context.Background(), criticality.SheddablePlus)
		ctx = attempt.NewOutgoingContext(ctx, 2)
		// A stale forwarded value must be replaced, not sent twice.
		ctx = metadata.AppendToOutgoingContext(ctx, wire.CriticalityKey, "CRITICAL_PLUS")
		want := "S:SHEDDABLE_PLUS/2"
		if !trusted {
			want = "S:CRITICAL/0"
		}
		for name, call := range map[string]func(context.Context, grpc.ClientConnInterface, string) (string, error){
			"unary": func(ctx context.Context, cc grpc.ClientConnInterface, b string) (string, error) {
				return relay.Invoke(ctx, cc, b)
			},
			"stream": relay.InvokeStream,
		} {
			got, err := call(ctx, cc, "x")
			if err != nil || got != want {
				t.Errorf("trusted=%v %s: got %q, %v; want %q", trusted, name, got, err, want)
			}
			if !trusted && len(sawKeys) != 0 {
				t.Errorf("%s: untrusted keys reached the handler: %v", name, sawKeys)
			}
		}
		cc.Close()
		s.Stop()
	}
}
