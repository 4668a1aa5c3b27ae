// Command devcerts writes a throwaway CA and the kit's TLS certificates
// for a try-out of deploy/kubernetes (never for production: the CA's key
// is written beside them):
//
//	go run ./cmd/devcerts -namespace triage-dev ../overlays/dev/certs
//
// It writes DIR/ca.crt and DIR/ca.key, DIR/etcd-ca.crt and
// DIR/etcd-ca.key (etcd's own authority: it signs only etcd and its
// client, the quota service), and DIR/NAME/tls.crt and tls.key for
// shop, quota, quota-etcd-client and etcd, with the names each is reached
// at in the namespace and a SPIFFE identity per service account, and for
// frontend, a caller's client certificate with the identity the edge
// configuration trusts, for calling the shop:
//
//	triage loadtest -url https://shop.NS.svc:7090/ -tls-ca DIR/ca.crt \
//	  -tls-cert DIR/frontend/tls.crt -tls-key DIR/frontend/tls.key
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

func main() {
	ns := flag.String("namespace", "triage", "the namespace the kit is deployed in")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: devcerts [-namespace NS] DIR")
		os.Exit(2)
	}
	if err := write(flag.Arg(0), *ns); err != nil {
		fmt.Fprintln(os.Stderr, "devcerts:", err)
		os.Exit(1)
	}
}

// leaf is one certificate the kit mounts.
type leaf struct {
	name    string
	dns     []string
	account string // the SPIFFE identity's service account
	usage   []x509.ExtKeyUsage
}

func leaves(ns string) []leaf {
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	svc := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, n, n+"."+ns+".svc", n+"."+ns+".svc.cluster.local")
		}
		return out
	}
	return []leaf{
		{name: "shop", dns: svc("shop"), account: "shop", usage: both},
		{name: "quota", dns: svc("quota", "quota-peers", "*.quota-peers"), account: "quota", usage: both},
		{name: "quota-etcd-client", account: "quota", usage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{name: "etcd", dns: append(svc("etcd", "*.etcd"), "localhost"), account: "etcd", usage: both},
		// A caller of the shop: a client certificate only.
		{name: "frontend", account: "frontend", usage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
	}
}

func write(dir, ns string) error {
	now := time.Now()
	cas := map[string]*authority{}
	for _, name := range []string{"ca", "etcd-ca"} {
		a, err := newAuthority(name, now)
		if err != nil {
			return err
		}
		if err := writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", a.der); err != nil {
			return err
		}
		if err := writeKey(filepath.Join(dir, name+".key"), a.key); err != nil {
			return err
		}
		cas[name] = a
	}
	for i, l := range leaves(ns) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		id, _ := url.Parse(fmt.Sprintf("spiffe://cluster.local/ns/%s/sa/%s", ns, l.account))
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: l.name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(90 * 24 * time.Hour),
			DNSNames: l.dns, URIs: []*url.URL{id},
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: l.usage,
		}
		a := cas[l.ca()]
		der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
		if err != nil {
			return err
		}
		if err := writePEM(filepath.Join(dir, l.name, "tls.crt"), "CERTIFICATE", der); err != nil {
			return err
		}
		if err := writeKey(filepath.Join(dir, l.name, "tls.key"), key); err != nil {
			return err
		}
	}
	return nil
}

// ca is the authority that signs l: etcd's own for etcd and its one
// client, so that no other workload's certificate (the shop's, a
// caller's) is accepted by etcd, where the quota policy lives.
func (l leaf) ca() string {
	if l.name == "etcd" || l.name == "quota-etcd-client" {
		return "etcd-ca"
	}
	return "ca"
}

type authority struct {
	cert *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

func newAuthority(name string, now time.Time) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "triage dev " + name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(90 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &authority{cert: cert, der: der, key: key}, nil
}

func writeKey(path string, k *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der)
}

func writePEM(path, typ string, der []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
