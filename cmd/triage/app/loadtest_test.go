package app

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/triagehq/triage/internal/testkit/loopback"
)

// shedsSheddable answers the critical levels and refuses the sheddable
// ones as overloaded, so that every outcome of a run is known in advance.
func shedsSheddable(level string) bool { return strings.HasPrefix(level, "SHEDDABLE") }

type loadtestFile struct {
	Capacity       float64 `json:"capacity_rps"`
	CapacityProbed bool    `json:"capacity_probed"`
	Probe          []any   `json:"probe"`
	Steps          []struct {
		Load      float64        `json:"load"`
		Scheduled int            `json:"scheduled"`
		Outcomes  map[string]int `json:"outcomes"`
		Levels    []struct {
			Level string `json:"criticality"`
			Sent  int    `json:"scheduled"`
			OK    int    `json:"ok"`
		} `json:"by_criticality"`
	} `json:"steps"`
}

func runLoadtestCommand(t *testing.T, args ...string) (loadtestFile, string) {
	t.Helper()
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if code := run(context.Background(), append(append([]string{"loadtest"}, args...), "-out", dir), &out, &errb); code != 0 {
		t.Fatalf("triage loadtest %v: exit %d\n%s\n%s", args, code, out.String(), errb.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "result.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res loadtestFile
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(dir, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(page, []byte("<svg")) || !bytes.Contains(page, []byte("Goodput against offered load")) {
		t.Errorf("index.html has no goodput figure")
	}
	return res, out.String()
}

// checkLedger checks that every scheduled call has one outcome and that
// the outcomes follow the criticalities: critical calls succeed (or, for
// a slow run, miss their deadline), sheddable ones are refused.
func checkLedger(t *testing.T, res loadtestFile, wantSteps int) {
	t.Helper()
	if len(res.Steps) != wantSteps {
		t.Fatalf("%d steps, want %d", len(res.Steps), wantSteps)
	}
	for _, st := range res.Steps {
		total := 0
		for _, n := range st.Outcomes {
			total += n
		}
		shed, crit := 0, 0
		for _, lr := range st.Levels {
			if shedsSheddable(lr.Level) {
				shed += lr.Sent
				if lr.OK != 0 {
					t.Errorf("step %gx: %d %s calls succeeded, the server refuses them all", st.Load, lr.OK, lr.Level)
				}
			} else {
				crit += lr.Sent
			}
		}
		if total != st.Scheduled || shed+crit != st.Scheduled || st.Outcomes["overloaded"] != shed {
			t.Errorf("step %gx: %d scheduled, outcomes %v, %d sheddable and %d critical calls", st.Load, st.Scheduled, st.Outcomes, shed, crit)
		}
		if st.Outcomes["ok"]+st.Outcomes["deadline-exceeded"]+st.Outcomes["not-sent"] != crit {
			t.Errorf("step %gx: outcomes %v for %d critical calls", st.Load, st.Outcomes, crit)
		}
	}
}

func TestLoadtestCommandOverGRPC(t *testing.T) {
	s := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		var in emptypb.Empty
		if err := stream.RecvMsg(&in); err != nil {
			return err
		}
		md, _ := metadata.FromIncomingContext(stream.Context())
		if l := md.Get("triage-criticality"); len(l) == 1 && shedsSheddable(l[0]) {
			return status.Error(codes.Unavailable, "overloaded")
		}
		return stream.SendMsg(&emptypb.Empty{})
	}))
	addr := loopback.ServeGRPC(t, s)
	res, out := runLoadtestCommand(t, "-grpc", addr, "-method", "/t.S/M", "-capacity", "100", "-loads", "0.5,2", "-step", "300ms", "-deadline", "2s")
	if res.Capacity != 100 || res.CapacityProbed {
		t.Errorf("capacity %v (probed %v), want the given 100", res.Capacity, res.CapacityProbed)
	}
	checkLedger(t, res, 2)
	if res.Steps[0].Scheduled != 15 || res.Steps[1].Scheduled != 60 {
		t.Errorf("scheduled %d and %d calls, want 15 and 60 (rate x 300 ms)", res.Steps[0].Scheduled, res.Steps[1].Scheduled)
	}
	if !strings.Contains(out, "capacity C = 100 calls/s (given)") || !strings.Contains(out, "SHEDDABLE_PLUS") {
		t.Errorf("the printed table:\n%s", out)
	}
	// Probing the capacity.
	res, _ = runLoadtestCommand(t, "-grpc", addr, "-method", "/t.S/M", "-loads", "0.5", "-step", "200ms", "-probe-step", "100ms", "-probe-callers", "4", "-mix", "CRITICAL:1")
	if !res.CapacityProbed || res.Capacity <= 0 || len(res.Probe) == 0 {
		t.Errorf("capacity %v (probed %v, %d probe steps), want a probed capacity", res.Capacity, res.CapacityProbed, len(res.Probe))
	}
	checkLedger(t, res, 1)
}

func TestLoadtestCommandOverHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") != "key-gmail" || r.Header.Get("Cookie") != "a=1; b=2" {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		if shedsSheddable(r.Header.Get("Triage-Criticality")) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	res, _ := runLoadtestCommand(t, "-url", srv.URL+"/search", "-header", "X-Api-Key: key-gmail", "-header", "Cookie: a=1; b=2", "-capacity", "100", "-loads", "1,3", "-step", "300ms", "-deadline", "2s")
	checkLedger(t, res, 2)
}

func TestLoadtestCommandRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "name one target"},
		{[]string{"-grpc", "127.0.0.1:1", "-method", "/a.B/C", "-url", "http://127.0.0.1:1/"}, "name one target"},
		{[]string{"-grpc", "127.0.0.1:1"}, "-method"},
		{[]string{"-grpc", "192.0.2.7:80", "-method", "/a.B/C"}, "not a loopback address"},
		{[]string{"-url", "http://192.0.2.7/x"}, "not a loopback address"},
		{[]string{"-url", "http://[2001:db8::1]:80/x"}, "not a loopback address"},
		{[]string{"-grpc", "127.0.0.1:1", "-method", "/a.B/C", "-mix", "CRITICAL"}, "-mix"},
		{[]string{"-grpc", "127.0.0.1:1", "-method", "/a.B/C", "-loads", "1,x"}, "-loads"},
		{[]string{"-grpc", "127.0.0.1:1", "-method", "/a.B/C", "-loads", "0"}, "positive multiple"},
		{[]string{"-grpc", "127.0.0.1:1", "-method", "/a.B/C", "-conns", "0"}, "-conns"},
		{[]string{"-grpc", "127.0.0.1:1", "-method", "/a.B/C", "-data-hex", "zz"}, "-data-hex"},
		{[]string{"-grpc", "127.0.0.1:1", "-method", "a.B/C"}, "method must be"},
		{[]string{"-grpc", "127.0.0.1:1", "-method", "/a.B/C", "-step", "5m", "-max-rate", "100"}, "over its maximum"},
		{[]string{"-grpc", "127.0.0.1:1", "-method", "/a.B/C", "-step", "20m"}, "a step may hold"},
		{[]string{"-url", "ftp://127.0.0.1/x"}, "not an http or https URL"},
		{[]string{"-url", "http://127.0.0.1/x", "-header", "nocolon"}, "-header"},
		{[]string{"-grpc", "127.0.0.1:1", "-method", "/a.B/C", "-tls-ca", "/nonexistent"}, "-tls-ca"},
		{[]string{"-grpc", "127.0.0.1:1", "-method", "/a.B/C", "-data", "{}", "-data-hex", "00"}, "give one of"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"loadtest"}, tc.args...), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("triage loadtest %v: exit %d, stderr %q; want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}

type helloService struct {
	testgrpc.UnimplementedTestServiceServer
}

func (helloService) UnaryCall(_ context.Context, in *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	if string(in.GetPayload().GetBody()) != "hello" {
		return nil, status.Error(codes.InvalidArgument, "want hello")
	}
	return &testgrpc.SimpleResponse{}, nil
}

// -data: the request in JSON, encoded through the server's reflection.
func TestLoadtestCommandJSONRequest(t *testing.T) {
	s := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(s, helloService{})
	reflection.Register(s)
	addr := loopback.ServeGRPC(t, s)
	res, _ := runLoadtestCommand(t, "-grpc", addr, "-method", "/grpc.testing.TestService/UnaryCall", "-data", `{"payload": {"body": "aGVsbG8="}}`,
		"-capacity", "100", "-loads", "1", "-step", "200ms", "-deadline", "2s", "-mix", "CRITICAL:1")
	if st := res.Steps[0]; st.Outcomes["ok"] != st.Scheduled || st.Scheduled != 20 {
		t.Errorf("outcomes %v of %d calls, want all 20 ok (the server checks the request)", st.Outcomes, st.Scheduled)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"loadtest", "-grpc", addr, "-method", "/grpc.testing.TestService/UnaryCall", "-data", `{"payload": 7}`, "-out", ""}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "SimpleRequest") {
		t.Errorf("a request that is not a SimpleRequest: exit %d, %q", code, errb.String())
	}
}
