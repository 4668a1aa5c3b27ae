package e2e

import (
	"net"
	"net/http"
	"net/url"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/conformance"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/triagesidecar"
	"github.com/triagehq/triage/trust"
)

// The conformance table (internal/testkit/conformance) through triage
// sidecar: the same rows, as gRPC
// calls to a sidecar configured like the servers above, in front of a
// gRPC upstream that believes the sidecar (its only trusted peer) and
// nothing else. The sidecar must refuse what the servers refuse, and the
// upstream's handler must see what theirs see: the criticality, attempt,
// customer, decay and deadline travel on the wire. Two things stay with
// the sidecar by design: the client type (isolation is the sidecar's
// decision) and which triage keys the caller sent (the upstream sees the
// keys the sidecar writes), so those two are not compared; and a decay
// that has already taken effect (its level is the request's, its time
// past) is spent, not forwarded, which leaves the request the same.
func TestConformanceThroughTheSidecar(t *testing.T) {
	call := conformanceSidecar(t)
	for _, row := range conformance.Rows {
		t.Run(row.Name, func(t *testing.T) {
			got, want := call(t, row), row.Want
			want.ClientType, want.TriageKeys = "", nil
			if want.DecayIn == 0 && want.DecayTo == want.Level.String() {
				want.DecayTo = ""
			}
			t.Logf("through the sidecar: %v", got)
			if got.String() != want.String() {
				t.Errorf("through the sidecar: %v\n want %v", got, want)
			}
		})
	}
}

// sidecarUpstream is a gRPC server on 127.0.0.1 that trusts only the
// sidecar's address and records what each call's handler sees.
func sidecarUpstream(t *testing.T, sidecarIP string) (*conformance.Recorder, string) {
	t.Helper()
	cl := edge.MustNew(edge.Config{Rules: []edge.RuleConfig{{Header: true}}})
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(
		intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{sidecarIP + "/32"}})), intake.WithClassifier(cl)))
	if err != nil {
		t.Fatal(err)
	}
	rec := &conformance.Recorder{}
	gs := grpc.NewServer(append(srv.ServerOptions(), grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		var in emptypb.Empty
		if err := ss.RecvMsg(&in); err != nil {
			return err
		}
		rec.Record(ss.Context(), nil)
		return ss.SendMsg(&emptypb.Empty{})
	}))...)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return rec, lis.Addr().String()
}

func conformanceSidecar(t *testing.T) func(*testing.T, conformance.Row) conformance.Seen {
	rec, upstream := sidecarUpstream(t, "127.0.0.1")
	opts, ctl := conformance.Setup(t, trustedIP)
	up, err := url.Parse("h2c://" + upstream)
	if err != nil {
		t.Fatal(err)
	}
	h, err := triagesidecar.Ingress(up, triagesidecar.WithTimeout(0), triagesidecar.WithMiddleware(
		triagehttp.WithIntake(opts...),
		triagehttp.WithAdmission(ctl),
		triagehttp.WithHealthCheck("/grpc.health.v1.Health/Check"),
		triagehttp.WithGroup(func(r *http.Request) string { return r.Header.Get("X-Plan") })))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", trustedIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h, Protocols: new(http.Protocols)}
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	go hs.Serve(lis)
	t.Cleanup(func() { hs.Close() })
	call := grpcCaller(t, lis.Addr().String(), rec)
	return func(t *testing.T, row conformance.Row) conformance.Seen {
		s := call(t, row)
		s.TriageKeys = nil // the upstream sees the keys the sidecar writes
		return s
	}
}
