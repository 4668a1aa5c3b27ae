package tlsfiles

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/internal/testkit/testcert"
)

// writePair writes a leaf for uri into dir as name.crt and name.key.
func writePair(t *testing.T, ca *testcert.CA, dir, name, uri string) Files {
	t.Helper()
	leaf, err := ca.Leaf(uri)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := testcert.PEM(leaf)
	if err != nil {
		t.Fatal(err)
	}
	f := Files{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key"), CA: filepath.Join(dir, "ca.pem")}
	for file, b := range map[string][]byte{f.Cert: cert, f.Key: key, f.CA: ca.PEM()} {
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// A server given a CA requires client certificates that the CA verifies;
// a client verifies the server against its CA. Over a real TLS handshake
// on loopback: the client with a certificate gets through and is seen
// with its identity, one without is refused.
func TestServerRequiresVerifiedClients(t *testing.T) {
	ca, err := testcert.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	srvFiles := writePair(t, ca, dir, "server", "spiffe://test/server")
	cliFiles := writePair(t, ca, dir, "client", "spiffe://test/task-a")
	scfg, err := srvFiles.Server()
	if err != nil {
		t.Fatal(err)
	}
	if scfg.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatalf("client auth %v", scfg.ClientAuth)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", scfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	seen := make(chan []string, 2)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			if tc.Handshake() == nil {
				var ids []string
				for _, u := range tc.ConnectionState().PeerCertificates[0].URIs {
					ids = append(ids, u.String())
				}
				seen <- ids
			}
			c.Close()
		}
	}()
	ccfg, err := cliFiles.Client()
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.Dial("tcp", lis.Addr().String(), ccfg)
	if err != nil {
		t.Fatalf("client with a certificate: %v", err)
	}
	c.Close()
	if ids := <-seen; len(ids) != 1 || ids[0] != "spiffe://test/task-a" {
		t.Errorf("server saw identities %v", ids)
	}
	noCert, err := Files{CA: cliFiles.CA}.Client()
	if err != nil {
		t.Fatal(err)
	}
	c, err = tls.Dial("tcp", lis.Addr().String(), noCert)
	if err == nil {
		// TLS 1.3: the refusal comes with the first read.
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if err == nil {
		t.Fatal("a client without a certificate got through")
	}
}

// Bad files get clear errors, not a panic.
func TestBadFiles(t *testing.T) {
	ca, err := testcert.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	good := writePair(t, ca, dir, "x", "spiffe://test/x")
	junk := filepath.Join(dir, "junk")
	os.WriteFile(junk, []byte("not PEM"), 0o600)
	for _, tc := range []struct {
		f      Files
		server bool
		want   string
	}{
		{Files{Key: good.Key}, true, "needs a certificate"},
		{Files{Cert: good.Cert, Key: junk}, true, "key pair"},
		{Files{Cert: good.Cert, Key: good.Key, CA: junk}, true, "no PEM certificate"},
		{Files{Cert: good.Cert, Key: good.Key, CA: filepath.Join(dir, "missing")}, true, "no such file"},
		{Files{Cert: good.Cert}, false, "needs its key"},
		{Files{CA: junk}, false, "no PEM certificate"},
	} {
		var err error
		if tc.server {
			_, err = tc.f.Server()
		} else {
			_, err = tc.f.Client()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v (server %v): %v, want an error containing %q", tc.f, tc.server, err, tc.want)
		}
	}
}

// A rotated key pair is picked up at the next handshake a second or more
// after the last check; a half-written one leaves the last good pair in
// use.
func TestKeyPairRotates(t *testing.T) {
	ca, err := testcert.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := writePair(t, ca, dir, "x", "spiffe://test/one")
	kp, err := newKeyPair(f.Cert, f.Key)
	if err != nil {
		t.Fatal(err)
	}
	fake := clock.NewFake(time.Now())
	kp.clock = fake
	uri := func() string {
		c, err := kp.get()
		if err != nil {
			t.Fatal(err)
		}
		leaf := c.Leaf
		if leaf == nil {
			t.Fatal("no parsed leaf")
		}
		return leaf.URIs[0].String()
	}
	if got := uri(); got != "spiffe://test/one" {
		t.Fatalf("first pair %s", got)
	}
	writePair(t, ca, dir, "x", "spiffe://test/two")
	future := time.Now().Add(time.Minute)
	os.Chtimes(f.Cert, future, future)
	os.Chtimes(f.Key, future, future)
	if got := uri(); got != "spiffe://test/one" {
		t.Fatalf("checked again within the second: %s", got)
	}
	fake.Advance(time.Second)
	if got := uri(); got != "spiffe://test/two" {
		t.Fatalf("after the rotation: %s", got)
	}
	os.WriteFile(f.Key, []byte("half written"), 0o600)
	later := future.Add(time.Minute)
	os.Chtimes(f.Key, later, later)
	fake.Advance(time.Second)
	if got := uri(); got != "spiffe://test/two" {
		t.Fatalf("after a broken rotation: %s", got)
	}
}
