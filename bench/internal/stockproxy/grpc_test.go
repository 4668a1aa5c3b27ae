package stockproxy

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// heldGRPC is a gRPC upstream that answers /bench.Burn/Call at once and
// holds /bench.Burn/Hold until the test ends.
func heldGRPC(t *testing.T) (addr string, inside chan struct{}) {
	t.Helper()
	inside = make(chan struct{}, 16)
	release := make(chan struct{})
	gs := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		var in emptypb.Empty
		if err := ss.RecvMsg(&in); err != nil {
			return err
		}
		if m, _ := grpc.MethodFromServerStream(ss); m == "/bench.Burn/Hold" {
			inside <- struct{}{}
			<-release
		}
		return ss.SendMsg(&emptypb.Empty{})
	}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(func() { close(release); gs.Stop() })
	return lis.Addr().String(), inside
}

// call invokes method through addr and returns its status code.
func call(t *testing.T, addr, method string) codes.Code {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return status.Code(cc.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{}))
}

// holdGRPC starts n held calls through addr and waits until the upstream
// holds them.
func holdGRPC(t *testing.T, addr string, inside chan struct{}, n int) {
	t.Helper()
	for range n {
		go func() { // answered when the test ends
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err == nil {
				cc.Invoke(context.Background(), "/bench.Burn/Hold", &emptypb.Empty{}, &emptypb.Empty{})
				cc.Close()
			}
		}()
		select {
		case <-inside:
		case <-time.After(10 * time.Second):
			t.Fatal("a held call never reached the upstream")
		}
	}
}

// In front of a gRPC upstream both proxies pass calls through as HTTP/2
// and refuse past their limits: nginx's limit_conn counts each stream,
// HAProxy's maxconn each call.
func TestGRPCThroughTheStockProxies(t *testing.T) {
	for _, tc := range []struct {
		proxy string
		c     Config
	}{
		{"nginx", Config{Conns: 1, GRPC: true}},
		{"haproxy", Config{Maxconn: 1, Queue: 100 * time.Millisecond, GRPC: true}},
	} {
		t.Run(tc.proxy, func(t *testing.T) {
			up, inside := heldGRPC(t)
			addr := start(t, tc.proxy, tc.c, up)
			if got := call(t, addr, "/bench.Burn/Call"); got != codes.OK {
				t.Fatalf("a call through %s: %v, want OK", tc.proxy, got)
			}
			holdGRPC(t, addr, inside, 1)
			if got := call(t, addr, "/bench.Burn/Call"); got != codes.Unavailable {
				t.Errorf("a call beside one held, limit 1: %v, want Unavailable (503)", got)
			}
		})
	}
}
