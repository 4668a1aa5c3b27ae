package triagegrpc_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagegrpc"
)

// A stock grpc-go client, without triage, whose service config retries
// UNAVAILABLE and RESOURCE_EXHAUSTED up to four attempts (gRFC A6), as a
// user's or a mesh's retry policy might: triage's answers carry
// grpc-retry-pushback-ms, so an outcome the caller must not retry (a
// server relaying its dependency's refusal as "overloaded; don't retry",
// a customer out of quota) is tried once, and task overloaded with a
// retry-after waits that long. A plain UNAVAILABLE from the handler, which
// is no triage outcome, is retried by the same policy: the policy works.
func TestStockClientsHonourPushback(t *testing.T) {
	const serviceConfig = `{"methodConfig": [{"name": [{"service": "` + relay.ServiceName + `"}],
	  "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
	    "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]}}]}`
	for _, tc := range []struct {
		name     string
		answer   error
		attempts int64
		code     codes.Code
		minWait  time.Duration
	}{
		{"downstream's refusal relayed", &outcome.Error{Kind: outcome.TaskOverloaded, Downstream: true}, 1, codes.ResourceExhausted, 0},
		{"own throttling relayed", &outcome.Error{Kind: outcome.TaskOverloaded, Local: true}, 1, codes.ResourceExhausted, 0},
		{"out of quota", &outcome.Error{Kind: outcome.OutOfQuota, RetryAfter: time.Second}, 1, codes.ResourceExhausted, 0},
		{"task overloaded, come back in 50 ms", &outcome.Error{Kind: outcome.TaskOverloaded, RetryAfter: 50 * time.Millisecond}, 4, codes.Unavailable, 150 * time.Millisecond},
		{"not triage's: the policy retries", status.Error(codes.Unavailable, "down"), 4, codes.Unavailable, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := triagegrpc.NewServer()
			if err != nil {
				t.Fatal(err)
			}
			s := grpc.NewServer(srv.ServerOptions()...)
			var calls atomic.Int64
			relay.RegisterFunc(s, func(context.Context, string) (string, error) {
				calls.Add(1)
				return "", tc.answer
			})
			cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, s), grpc.WithDefaultServiceConfig(serviceConfig))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			_, err = relay.Invoke(ctx, cc, "x")
			took := time.Since(start)
			if status.Code(err) != tc.code {
				t.Fatalf("answer %v, want %v", err, tc.code)
			}
			if got := calls.Load(); got != tc.attempts {
				t.Errorf("the handler ran %d times, want %d", got, tc.attempts)
			}
			if took < tc.minWait {
				t.Errorf("the retries came after %v in all, want at least %v (three pushbacks)", took, tc.minWait)
			}
		})
	}
}
