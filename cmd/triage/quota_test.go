package main

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/internal/testcert"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
)

// writeLeaf writes a leaf of ca for uri as dir/name.crt and dir/name.key.
func writeLeaf(t *testing.T, ca *testcert.CA, dir, name, uri string) (cert, key string, pair tls.Certificate) {
	t.Helper()
	pair, err := ca.Leaf(uri)
	if err != nil {
		t.Fatal(err)
	}
	c, k, err := testcert.PEM(pair)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(cert, c, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, k, 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key, pair
}

// triage quota-server with -tls-cert, -tls-key and -tls-ca: a task whose
// certificate the CA verifies reports as its identity, or as the task
// -bind maps it to; a report as another task is refused, and so is a
// caller without a certificate. The server stops when its context ends.
// Without the TLS flags it refuses to listen beyond loopback unless told
// -unauthenticated.
func TestQuotaServerTLS(t *testing.T) {
	ca, err := testcert.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	os.WriteFile(caFile, ca.PEM(), 0o600)
	srvCert, srvKey, _ := writeLeaf(t, ca, dir, "server", "spiffe://test/quota")
	_, _, taskA := writeLeaf(t, ca, dir, "a", "spiffe://test/db-0")
	_, _, host7 := writeLeaf(t, ca, dir, "h", "spiffe://test/host-7")
	policy := filepath.Join(dir, "quota.yaml")
	os.WriteFile(policy, []byte("tasks: 2\ncustomers: {ads: {cpu: 2}}\n"), 0o600)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, done, errb := startCommand(t, ctx, "quota-server", "-config", policy, "-listen", "127.0.0.1:0",
		"-tls-cert", srvCert, "-tls-key", srvKey, "-tls-ca", caFile, "-bind", "spiffe://test/host-7=db-7")
	refresh := func(cert *tls.Certificate, task string) error {
		cfg := &tls.Config{RootCAs: ca.Pool}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		cc, err := grpc.NewClient(addr, append(quotaservice.DialOptions(time.Second), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer rcancel()
		_, err = quotapb.NewQuotaClient(cc).Refresh(rctx, &quotapb.RefreshRequest{Task: task})
		return err
	}
	for _, tc := range []struct {
		cert *tls.Certificate
		task string
		want codes.Code
	}{
		{&taskA, "spiffe://test/db-0", codes.OK},
		{&taskA, "spiffe://test/db-1", codes.PermissionDenied},
		{&host7, "db-7", codes.OK},
		{nil, "spiffe://test/db-0", codes.Unavailable},
	} {
		if got := status.Code(refresh(tc.cert, tc.task)); got != tc.want {
			t.Errorf("certificate %v, task %s: %v, want %v", tc.cert != nil, tc.task, got, tc.want)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d: %s", code, errb.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the quota service did not stop")
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-listen", "0.0.0.0:0"}, "beyond loopback"},
		{[]string{"-bind", "spiffe://x=t"}, "-bind needs -tls-ca"},
		{[]string{"-bind", "nope"}, "IDENTITY=TASK"},
		{[]string{"-tls-ca", caFile}, "needs a certificate"},
		{[]string{"-tls-cert", srvCert, "-tls-key", srvKey, "-tls-ca", caFile, "-unauthenticated"}, "contradict"},
	} {
		var o, e strings.Builder
		if code := run(context.Background(), append([]string{"quota-server", "-config", policy}, tc.args...), &o, &e); code != 2 || !strings.Contains(e.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q, want 2 and %q", tc.args, code, e.String(), tc.want)
		}
	}
}
