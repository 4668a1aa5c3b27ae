package triagegrpc_test

import (
	"context"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/triagegrpc"
)

// By default the Client turns off the service config's retryPolicy, so a
// call failed with UNAVAILABLE, which the Caller does not retry, is sent
// once; WithServiceConfigRetries keeps it, and grpc-go retries the call.
func TestServiceConfigRetries(t *testing.T) {
	var attempts atomic.Int32
	s := grpc.NewServer()
	relay.Register(s, &relay.Tier{Name: "B", Fail: func(context.Context, string) error {
		if attempts.Add(1)%2 == 1 {
			return status.Error(codes.Unavailable, "every other call fails")
		}
		return nil
	}})
	addr := loopback.ServeGRPC(t, s)
	sc := grpc.WithDefaultServiceConfig(`{"methodConfig": [{"name": [{"service": "` + relay.ServiceName + `"}],
	  "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
	    "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`)
	for _, keep := range []bool{false, true} {
		var opts []triagegrpc.ClientOption
		if keep {
			opts = append(opts, triagegrpc.WithServiceConfigRetries())
		}
		client, err := triagegrpc.NewClient(loopback.Caller(t), opts...)
		if err != nil {
			t.Fatal(err)
		}
		cc := loopback.DialGRPC(t, addr, append(client.DialOptions(), sc)...)
		attempts.Store(0)
		_, err = relay.Invoke(context.Background(), cc, "x")
		if keep && (err != nil || attempts.Load() != 2) {
			t.Errorf("service config retries kept: %v after %d attempts; want success after 2", err, attempts.Load())
		}
		if !keep && (status.Code(err) != codes.Unavailable || attempts.Load() != 1) {
			t.Errorf("service config retries off: %v after %d attempts; want UNAVAILABLE after 1", err, attempts.Load())
		}
	}
}
