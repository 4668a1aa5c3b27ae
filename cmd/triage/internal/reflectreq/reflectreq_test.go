package reflectreq

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/proto"

	"github.com/triagehq/triage/internal/testkit/loopback"
)

type testService struct {
	testgrpc.UnimplementedTestServiceServer
}

func TestEncodeThroughServerReflection(t *testing.T) {
	s := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(s, testService{})
	reflection.Register(s)
	cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := Encode(ctx, cc, "/grpc.testing.TestService/UnaryCall", `{"responseSize": 3, "payload": {"body": "aGVsbG8="}}`)
	if err != nil {
		t.Fatal(err)
	}
	var got testgrpc.SimpleRequest
	if err := proto.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.GetResponseSize() != 3 || string(got.GetPayload().GetBody()) != "hello" {
		t.Errorf("encoded %v, want response_size 3 and body hello", &got)
	}
	for _, tc := range []struct{ method, json, want string }{
		{"/grpc.testing.TestService/UnaryCall", `{"responseSize": "x"}`, "not a grpc.testing.SimpleRequest"},
		{"/grpc.testing.TestService/UnaryCall", `{"noSuchField": 1}`, "not a grpc.testing.SimpleRequest"},
		{"/grpc.testing.TestService/NoSuch", `{}`, "has no method NoSuch"},
		{"/no.Such/Method", `{}`, "reflection"},
		{"grpc.testing.TestService/UnaryCall", `{}`, "is not"},
		{"/grpc.testing.TestService", `{}`, "is not"},
	} {
		if _, err := Encode(ctx, cc, tc.method, tc.json); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Encode(%s, %s) = %v, want an error with %q", tc.method, tc.json, err, tc.want)
		}
	}
}

func TestEncodeWithoutReflection(t *testing.T) {
	s := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(s, testService{})
	cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Encode(ctx, cc, "/grpc.testing.TestService/UnaryCall", `{}`); err == nil || !strings.Contains(err.Error(), "does the server register it") {
		t.Errorf("Encode without a reflection service = %v, want an error saying so", err)
	}
}
