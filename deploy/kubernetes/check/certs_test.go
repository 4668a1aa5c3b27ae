package check

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
)

// The kit's certificates (cmd/devcerts, and the overlays' layout for
// yours): etcd trusts its own authority, which signs etcd and the quota
// service's etcd client only, so that a workload's certificate (the
// shop's, a caller's, the quota service's serving one) cannot reach etcd
// and rewrite the quota policy; the caller's certificate (frontend) is
// one the shop's sidecar accepts, with the identity the dev overlay's
// edge configuration trusts.
func TestCertificateRoles(t *testing.T) {
	dir := t.TempDir()
	run(t, ".", "go", "run", "./cmd/devcerts", "-namespace", "triage-dev", dir)
	pool := func(name string) *x509.CertPool {
		p := x509.NewCertPool()
		p.AddCert(load(t, filepath.Join(dir, name)))
		return p
	}
	etcdCA, workloadCA := pool("etcd-ca.crt"), pool("ca.crt")
	verifies := func(leaf string, roots *x509.CertPool) bool {
		_, err := load(t, filepath.Join(dir, leaf, "tls.crt")).Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		return err == nil
	}
	if !verifies("quota-etcd-client", etcdCA) {
		t.Error("etcd does not accept the quota service's etcd client")
	}
	for _, leaf := range []string{"shop", "quota", "frontend"} {
		if verifies(leaf, etcdCA) {
			t.Errorf("etcd accepts %s's certificate: it could write the quota policy", leaf)
		}
	}
	if !verifies("frontend", workloadCA) {
		t.Error("the shop's sidecar does not accept the caller's certificate")
	}
	front := load(t, filepath.Join(dir, "frontend", "tls.crt"))
	if len(front.URIs) != 1 || front.URIs[0].String() != "spiffe://cluster.local/ns/triage-dev/sa/frontend" {
		t.Errorf("the caller's identity is %v, not the one the dev overlay's edge configuration trusts", front.URIs)
	}
}

func load(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
