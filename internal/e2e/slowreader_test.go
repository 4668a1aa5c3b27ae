package e2e

// Issue 20, a hostile or broken peer over loopback: a client that opens a
// streaming call and does not read its responses, or holds a stream open
// without sending its next message. The handler waits on that client, in
// grpc's SendMsg (flow control) or RecvMsg; once it has waited the
// controller's target delay it gives its execution slot and its room
// back, so the task's one slot serves other clients meanwhile. The
// clients are grpc's own interop TestService client, as users have it.

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// streamingService streams 64 KiB responses, far more than grpc's flow
// control windows hold, and echoes on its full-duplex call.
type streamingService struct {
	testgrpc.UnimplementedTestServiceServer
	sent atomic.Int64
}

const streamedResponses = 200 // of 64 KiB: 12.5 MiB

func (s *streamingService) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

func (s *streamingService) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, st testgrpc.TestService_StreamingOutputCallServer) error {
	body := make([]byte, 64<<10)
	for range streamedResponses {
		if err := st.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: body}}); err != nil {
			return err
		}
		s.sent.Add(1)
	}
	return nil
}

func (s *streamingService) FullDuplexCall(st testgrpc.TestService_FullDuplexCallServer) error {
	for {
		in, err := st.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := st.Send(&testgrpc.StreamingOutputCallResponse{Payload: in.Payload}); err != nil {
			return err
		}
	}
}

type readerServer struct {
	f      *clock.Fake
	ctl    *admission.Controller
	svc    *streamingService
	client testgrpc.TestServiceClient
}

// startReaderServer serves the streaming service with one execution slot,
// admission control on a fake clock, and the Server's own options.
func startReaderServer(t *testing.T) *readerServer {
	t.Helper()
	r := &readerServer{f: clock.NewFake(time.Unix(0, 0)), svc: &streamingService{}}
	var err error
	r.ctl, err = admission.New(admission.WithClock(r.f), admission.WithDelayMeasure(admission.SchedulerDelay),
		admission.WithLimits(1, 1, 1), admission.WithInterval(time.Hour), admission.WithMaxWait(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := triagegrpc.NewServer(triagegrpc.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})),
		triagegrpc.WithAdmission(r.ctl), triagegrpc.WithServerClock(r.f))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(srv.ServerOptions()...)
	testgrpc.RegisterTestServiceServer(gs, r.svc)
	// Fixed flow-control windows: grpc's default grows them by its
	// bandwidth estimate, up to 16 MiB a stream, which would take the
	// whole response unread.
	cc, err := grpc.NewClient("passthrough:///"+listenAndServe(t, gs), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	r.client = testgrpc.NewTestServiceClient(cc)
	return r
}

// stall moves the fake clock on by the target delay, as time would pass,
// until the controller counts n requests stalled on their clients and
// none running or holding room. A send may wait briefly on grpc's own
// writer before it blocks on the client for good: such a wait may stall
// and end, and the clock moves on until the wait that lasts has.
func (r *readerServer) stall(t *testing.T, n int64) {
	t.Helper()
	waitFor(t, "the handler to stall on its client", func() bool {
		if s := r.ctl.Stats(); s.Stalled == n && s.Executing == 0 && s.Pending == 0 {
			return true
		}
		r.f.Advance(r.ctl.TargetDelay())
		return false
	})
}

// served checks that a call from another client is served while the only
// slot's holder waits on its own client. The fake clock moves on
// meanwhile, as time would. Without the stall the call waits for the
// slot (its maximum wait is an hour of the fake clock) until its real
// deadline.
func (r *readerServer) served(t *testing.T, who string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "triage-criticality", "CRITICAL")
	done := make(chan error, 1)
	go func() {
		_, err := r.client.EmptyCall(ctx, &testgrpc.Empty{})
		done <- err
	}()
	var err error
	waitFor(t, "the call beside "+who, func() bool {
		select {
		case err = <-done:
			return true
		default:
			r.f.Advance(r.ctl.TargetDelay())
			return false
		}
	})
	if err != nil {
		t.Fatalf("a call beside %s: %v, want it served", who, err)
	}
}

// A client that opens a streaming call and does not read it holds its
// stream, not the task: once the handler's send has blocked for the
// target delay, the slot serves other calls, and the stalled request
// counts in no room. When the client reads again, the stream completes;
// when it goes away instead, nothing is left counted.
func TestSlowReaderGivesItsSlotBack(t *testing.T) {
	r := startReaderServer(t)
	for _, goesAway := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		st, err := r.client.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
		if err != nil {
			t.Fatal(err)
		}
		r.stall(t, 1)
		r.served(t, "a stream its client does not read")
		if n := r.svc.sent.Load(); n >= streamedResponses {
			t.Fatalf("the handler sent all %d responses unread", n)
		}
		if goesAway {
			cancel()
		} else {
			got := 0
			for {
				_, err := st.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("after %d responses read: %v", got, err)
				}
				got++
			}
			if got != streamedResponses {
				t.Fatalf("read %d responses, want %d", got, streamedResponses)
			}
			cancel()
		}
		waitFor(t, "the stream's request to end", func() bool {
			s := r.ctl.Stats()
			return s.Executing == 0 && s.Stalled == 0 && s.Pending == 0 && s.Queued == 0
		})
		r.svc.sent.Store(0)
	}
}

// A client that holds a full-duplex stream open without sending its next
// message does not hold the task's slot either; the stream works on when
// it does.
func TestIdleStreamGivesItsSlotBack(t *testing.T) {
	r := startReaderServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := r.client.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.stall(t, 1)
	r.served(t, "an idle stream")
	if err := st.Send(&testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: []byte("ping")}}); err != nil {
		t.Fatal(err)
	}
	if in, err := st.Recv(); err != nil || string(in.Payload.Body) != "ping" {
		t.Fatalf("echo after the stall: %v, %v", in, err)
	}
	st.CloseSend()
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("end of the stream: %v", err)
	}
	waitFor(t, "the stream's request to end", func() bool {
		s := r.ctl.Stats()
		return s.Executing == 0 && s.Stalled == 0 && s.Pending == 0
	})
}
