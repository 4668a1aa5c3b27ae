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
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// streamingService streams 64 KiB responses, far more than grpc's flow
// control windows hold, and echoes on its full-duplex call.
type streamingService struct {
	testgrpc.UnimplementedTestServiceServer
	sent      atomic.Int64
	responses int // 0: streamedResponses
}

const streamedResponses = 200 // of 64 KiB: 12.5 MiB

func (s *streamingService) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

func (s *streamingService) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, st testgrpc.TestService_StreamingOutputCallServer) error {
	body := make([]byte, 64<<10)
	n := s.responses
	if n == 0 {
		n = streamedResponses
	}
	for range n {
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
	return startReaderServerWith(t, 1, &streamingService{})
}

// startReaderServerWith serves svc with limit execution slots.
func startReaderServerWith(t *testing.T, limit int, svc testgrpc.TestServiceServer) *readerServer {
	t.Helper()
	r := &readerServer{f: clock.NewFake(time.Unix(0, 0))}
	r.svc, _ = svc.(*streamingService)
	var err error
	r.ctl, err = admission.New(admission.WithClock(r.f), admission.WithDelayMeasure(admission.SchedulerDelay),
		admission.WithLimits(limit, limit, limit), admission.WithInterval(time.Hour), admission.WithMaxWait(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})),
		intake.WithAdmission(r.ctl)), triagegrpc.WithServerClock(r.f))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(srv.ServerOptions()...)
	testgrpc.RegisterTestServiceServer(gs, svc)
	// Fixed flow-control windows: grpc's default grows them by its
	// bandwidth estimate, up to 16 MiB a stream, which would take the
	// whole response unread.
	cc, err := grpc.NewClient("passthrough:///"+loopback.ServeGRPC(t, gs), grpc.WithTransportCredentials(insecure.NewCredentials()),
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

// peakExecuting samples the controller's executing requests as fast as it
// can until stop is closed, and returns the highest it saw.
func peakExecuting(ctl *admission.Controller, stop <-chan struct{}) <-chan int64 {
	peak := make(chan int64, 1)
	go func() {
		var top int64
		for {
			select {
			case <-stop:
				peak <- top
				return
			default:
			}
			top = max(top, ctl.Stats().Executing)
			runtime.Gosched()
		}
	}()
	return peak
}

// Issue 38, stall-then-burst: a client lets many streaming calls stall,
// then reads them all at once. The stalled requests come back through the
// execution slots, ahead of new arrivals, never past the limit: with a
// limit of 2, 60 streams of 16 x 64 KiB each admitted and left unread until stalled,
// then all read at once, never have more than 2 executing.
func TestStalledStreamsComeBackWithinTheLimit(t *testing.T) {
	const limit, calls, responses = 2, 60, 16
	r := startReaderServerWith(t, limit, &streamingService{responses: responses})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	streams := make([]testgrpc.TestService_StreamingOutputCallClient, calls)
	for i := range streams {
		var err error
		if streams[i], err = r.client.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{}); err != nil {
			t.Fatal(err)
		}
		r.stall(t, int64(i+1))
	}
	stop := make(chan struct{})
	peak := peakExecuting(r.ctl, stop)
	var read atomic.Int64
	errs := make(chan error, calls)
	for _, st := range streams {
		go func() {
			for {
				_, err := st.Recv()
				if errors.Is(err, io.EOF) {
					errs <- nil
					return
				}
				if err != nil {
					errs <- err
					return
				}
				read.Add(1)
			}
		}()
	}
	// 60 MiB through the stalls and back, under the race detector on a
	// busy machine: a minute, not loopback.WaitFor's ten seconds.
	r.collectWithin(t, "a stream read after its stall", errs, calls, time.Minute)
	close(stop)
	if got := <-peak; got > limit {
		t.Fatalf("%d stalled streams read at once: %d executing at the peak, want at most the limit %d", calls, got, limit)
	}
	if n := read.Load(); n != calls*responses {
		t.Fatalf("read %d responses, want %d", n, calls*responses)
	}
	waitFor(t, "every request to end", func() bool {
		s := r.ctl.Stats()
		return s.Executing == 0 && s.Stalled == 0 && s.Pending == 0 && s.Queued == 0
	})
}

// readerGoroutineService's full-duplex handler reads its client on a
// goroutine of its own, as grpc-go allows, while its own goroutine works
// for workFor, then answers; it counts the handlers working at once.
type readerGoroutineService struct {
	testgrpc.UnimplementedTestServiceServer
	working, peak atomic.Int64
}

const workFor = 100 * time.Millisecond

func (s *readerGoroutineService) FullDuplexCall(st testgrpc.TestService_FullDuplexCallServer) error {
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}()
	n := s.working.Add(1)
	for {
		p := s.peak.Load()
		if n <= p || s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	time.Sleep(workFor) // the handler's own work: it holds its slot
	s.working.Add(-1)
	return st.Send(&testgrpc.StreamingOutputCallResponse{})
}

// Issue 38, a reader goroutine: a handler whose goroutine reading the
// client waits while its own goroutine works is not stalled, so admission
// still bounds the work: with a limit of 2, 20 such calls at once never
// have more than 2 working.
func TestReaderGoroutineDoesNotFreeAWorkingSlot(t *testing.T) {
	const limit, calls = 2, 20
	svc := &readerGoroutineService{}
	r := startReaderServerWith(t, limit, svc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, calls)
	for range calls {
		go func() {
			for { // a call refused at arrival (the queue is full) comes again
				st, err := r.client.FullDuplexCall(ctx)
				if err == nil {
					_, err = st.Recv()
				}
				if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
					errs <- err
					return
				}
			}
		}()
	}
	r.collect(t, "a call", errs, calls)
	if got := svc.peak.Load(); got > limit {
		t.Fatalf("%d handlers worked at once with a limit of %d: their reader goroutines freed their slots", got, limit)
	}
}

// collect waits for n results on errs, each nil, moving the fake clock on
// by the target delay meanwhile, as time would pass for the stall timers.
func (r *readerServer) collect(t *testing.T, what string, errs <-chan error, n int) {
	t.Helper()
	r.collectWithin(t, what, errs, n, 10*time.Second)
}

// collectWithin is collect for at most d; its failure says what the
// controller holds.
func (r *readerServer) collectWithin(t *testing.T, what string, errs <-chan error, n int, d time.Duration) {
	t.Helper()
	done := 0
	deadline := time.Now().Add(d)
	for done < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d results of %s after %v; the controller: %+v", done, n, what, d, r.ctl.Stats())
		}
		select {
		case err := <-errs:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			done++
			continue
		default:
		}
		r.f.Advance(r.ctl.TargetDelay())
		time.Sleep(time.Millisecond) // polling a real server over sockets
	}
}
