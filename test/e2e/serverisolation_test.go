package e2e

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagegrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// A gRPC service reached through per-client hostnames: the tap names the
// client type from :authority and refuses a black-holed one before a
// handler runs; the handler's calls carry the client type for the balancer.
func TestServerIsolationByAuthority(t *testing.T) {
	tb, err := isolate.New(isolate.Config{Clients: []isolate.Client{
		{Name: "maps", Hosts: []string{"maps.example.test"}},
		{Name: "spam", Hosts: []string{"spam.example.test"}, Route: "black-hole"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var seen sync.Map
	addr := serveB(t, func(ctx context.Context, body string) error {
		seen.Store(body, isolate.ClientOf(ctx))
		return nil
	}, triagegrpc.WithIntake(intake.WithIsolation(tb)))
	call := func(authority string) error {
		cc, err := grpc.NewClient("passthrough:///"+addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithAuthority(authority)}, loopback.Client(t, egress.WithoutPolicy()).DialOptions()...)...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		_, err = relay.Invoke(context.Background(), cc, authority)
		return err
	}
	if err := call("maps.example.test:443"); err != nil {
		t.Fatal(err)
	}
	if ct, _ := seen.Load("maps.example.test:443"); ct != "maps" {
		t.Errorf("the handler saw client type %q, want maps", ct)
	}
	err = call("spam.example.test")
	if !errors.Is(err, outcome.ErrDontRetry) {
		t.Errorf("black-holed client type: %v, want overloaded; don't retry", err)
	}
	if _, ran := seen.Load("spam.example.test"); ran {
		t.Error("a black-holed request reached the handler")
	}
	if err := call("other.example.test"); err != nil {
		t.Errorf("an unnamed host: %v", err)
	}
}
