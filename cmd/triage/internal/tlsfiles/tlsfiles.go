// Package tlsfiles builds the TLS configurations of triage's own services
// (the quota service, the batch proxy) and of their clients from PEM files
// named on the command line. A key pair is read again when its files
// change (checked at each handshake, at most once a second), so that
// short-lived certificates rotate without a restart; the CA bundle is read
// once.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/triagehq/triage/clock"
)

// Files names the PEM files of one side of a connection.
type Files struct {
	// Cert and Key are this side's certificate chain and private key.
	Cert, Key string
	// CA is the bundle that verifies the other side: a server given one
	// requires and verifies client certificates; a client verifies the
	// server against it (empty: the system roots).
	CA string

	deprecated string // the warning for a deprecated flag given
}

// RegisterServer defines a server's flags on fs: -<prefix>tls-cert and
// -<prefix>tls-key, what it presents, and -<prefix>tls-client-ca, the
// bundle that verifies its clients' certificates (required when given);
// peer names the clients in their usage ("callers", "tasks").
// -<prefix>tls-ca is the deprecated spelling of -<prefix>tls-client-ca,
// kept for one minor version: Deprecated reports its use.
func (f *Files) RegisterServer(fs *flag.FlagSet, prefix, peer string) {
	fs.StringVar(&f.Cert, prefix+"tls-cert", "", "PEM certificate chain presented to "+peer+" (with -"+prefix+"tls-key)")
	fs.StringVar(&f.Key, prefix+"tls-key", "", "PEM private key of -"+prefix+"tls-cert")
	fs.StringVar(&f.CA, prefix+"tls-client-ca", "", "PEM CA bundle that verifies "+peer+"' client certificates, which are then required")
	fs.Func(prefix+"tls-ca", "deprecated: -"+prefix+"tls-client-ca", func(v string) error {
		f.CA, f.deprecated = v, "-"+prefix+"tls-ca is deprecated: use -"+prefix+"tls-client-ca"
		return nil
	})
}

// RegisterClient defines a client's flags on fs: -<prefix>tls-cert and
// -<prefix>tls-key, the client certificate it presents, and
// -<prefix>tls-ca, the bundle that verifies the server; peer names the
// server in their usage ("the upstream", "etcd").
func (f *Files) RegisterClient(fs *flag.FlagSet, prefix, peer string) {
	fs.StringVar(&f.Cert, prefix+"tls-cert", "", "PEM client certificate chain presented to "+peer+" (with -"+prefix+"tls-key)")
	fs.StringVar(&f.Key, prefix+"tls-key", "", "PEM private key of -"+prefix+"tls-cert")
	fs.StringVar(&f.CA, prefix+"tls-ca", "", "PEM CA bundle that verifies "+peer+"'s certificate (default: the system roots)")
}

// Deprecated returns a warning for a deprecated flag that was given, or "".
func (f Files) Deprecated() string { return f.deprecated }

// Set reports whether any file is named.
func (f Files) Set() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Server returns a server's configuration: it presents Cert and Key and,
// with CA, requires a client certificate that CA verifies. TLS 1.2 at
// least.
func (f Files) Server() (*tls.Config, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("tls: a server needs a certificate and its key")
	}
	kp, err := newKeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, err
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return kp.get() }}
	if f.CA != "" {
		if c.ClientCAs, err = pool(f.CA); err != nil {
			return nil, err
		}
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// Client returns a client's configuration: it verifies the server
// against CA (the system roots without one) and presents Cert and Key
// when they are named.
func (f Files) Client() (*tls.Config, error) {
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("tls: a client certificate needs its key, and a key its certificate")
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		var err error
		if c.RootCAs, err = pool(f.CA); err != nil {
			return nil, err
		}
	}
	if f.Cert != "" {
		kp, err := newKeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, err
		}
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return kp.get() }
	}
	return c, nil
}

func pool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tls: CA bundle: %w", err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("tls: CA bundle %s: no PEM certificate in it", file)
	}
	return p, nil
}

// keyPair is a certificate and key read from files, read again when
// either file's modification time changes.
type keyPair struct {
	cert, key string
	clock     clock.Clock

	mu      sync.Mutex
	c       *tls.Certificate
	checked time.Time
	mod     [2]time.Time
}

func newKeyPair(cert, key string) (*keyPair, error) {
	kp := &keyPair{cert: cert, key: key, clock: clock.Real()}
	if err := kp.load(); err != nil {
		return nil, err
	}
	return kp, nil
}

func (kp *keyPair) load() error {
	var mod [2]time.Time
	for i, f := range []string{kp.cert, kp.key} {
		st, err := os.Stat(f)
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		mod[i] = st.ModTime()
	}
	c, err := tls.LoadX509KeyPair(kp.cert, kp.key)
	if err != nil {
		return fmt.Errorf("tls: key pair %s, %s: %w", kp.cert, kp.key, err)
	}
	kp.c, kp.mod = &c, mod
	return nil
}

// get returns the key pair, read again if its files changed (checked at
// most once a second). A pair that no longer loads (half-written during a
// rotation) leaves the last good one in use.
func (kp *keyPair) get() (*tls.Certificate, error) {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if now := kp.clock.Now(); now.Sub(kp.checked) >= time.Second {
		kp.checked = now
		changed := false
		for i, f := range []string{kp.cert, kp.key} {
			if st, err := os.Stat(f); err == nil && !st.ModTime().Equal(kp.mod[i]) {
				changed = true
			}
		}
		if changed {
			old := kp.c
			if kp.load() != nil {
				kp.c = old
			}
		}
	}
	return kp.c, nil
}
