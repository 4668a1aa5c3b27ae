package reflectreq

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
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

// endedConn is a connection whose every stream the server has already
// ended with status st: SendMsg says io.EOF, RecvMsg gives st, as grpc-go
// does when the server's answer wins the race with the client's send.
type endedConn struct{ st error }

func (c endedConn) Invoke(context.Context, string, any, any, ...grpc.CallOption) error { return c.st }
func (c endedConn) NewStream(ctx context.Context, _ *grpc.StreamDesc, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
	return endedStream{ctx: ctx, st: c.st}, nil
}

type endedStream struct {
	grpc.ClientStream
	ctx context.Context
	st  error
}

func (s endedStream) Context() context.Context { return s.ctx }
func (s endedStream) SendMsg(any) error        { return io.EOF }
func (s endedStream) RecvMsg(any) error        { return s.st }
func (s endedStream) CloseSend() error         { return nil }

// When the server ended the reflection stream before the request was sent
// (it has no reflection service: UNIMPLEMENTED), the error is the
// stream's status, read after the send's io.EOF, and says what to do; it
// was a bare "EOF" in one CI run under the race detector.
func TestEncodeReadsTheStatusAfterEOF(t *testing.T) {
	cc := endedConn{st: status.Error(codes.Unimplemented, "unknown service grpc.reflection.v1.ServerReflection")}
	_, err := Encode(context.Background(), cc, "/grpc.testing.TestService/UnaryCall", `{}`)
	if err == nil || !strings.Contains(err.Error(), "does the server register it") || status.Code(errors.Unwrap(err)) != codes.Unimplemented {
		t.Errorf("Encode after the server ended the stream = %v, want its UNIMPLEMENTED status and the advice", err)
	}
}
