package app

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// SIGTERM is a clean shutdown for the command as a process, and so for
// this test binary when it runs as the command (the drill's and the fault
// harness's tasks): the service says NOT_SERVING for its drain, then
// exits 0. Without it the test binary's tasks died at once on SIGTERM, and
// the fault harness's rolling restart was a crash in CI.
func TestSIGTERMIsACleanShutdown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	policy := filepath.Join(t.TempDir(), "quota.yaml")
	if err := os.WriteFile(policy, []byte("customers: {ads: {cpu: 2}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, addr, errb := startCLI(t, []string{"quota-server", "-policy", policy, "-listen", "127.0.0.1:0", "-drain", "1s"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	w, err := healthpb.NewHealthClient(cc).Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("before SIGTERM: %v, %v", r, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r, err := w.Recv()
	if err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("after SIGTERM the health watch got %v, %v; want NOT_SERVING (lame duck)", r, err)
	}
	wcancel()
	if err := cmd.Wait(); err != nil {
		t.Errorf("after SIGTERM: %v (want exit 0); stderr %q", err, errb.String())
	}
}

// A serving command told to stop as it starts (its context already done:
// a SIGTERM during start-up) stops cleanly: exit 0, not "the server has
// been stopped" because the stop came before Serve.
func TestStopAsItStarts(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "quota.yaml")
	if err := os.WriteFile(policy, []byte("customers: {ads: {cpu: 2}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, args := range [][]string{
		{"quota-server", "-policy", policy, "-listen", "127.0.0.1:0", "-drain", "0s"},
		{"extproc", "-listen", "127.0.0.1:0", "-drain", "0s"},
		{"proxy", "-backends", "127.0.0.1:1", "-listen", "127.0.0.1:0", "-drain", "0s"},
	} {
		for range 20 {
			var out, errb bytes.Buffer
			if code := run(ctx, args, &out, &errb); code != 0 {
				t.Fatalf("%s stopped as it started: exit %d: %s", args[0], code, errb.String())
			}
		}
	}
}
