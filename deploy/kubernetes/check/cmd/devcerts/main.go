// Command devcerts writes a throwaway CA and the kit's TLS certificates
// for a try-out of deploy/kubernetes (never for production: the CA's key
// is written beside them):
//
//	go run ./cmd/devcerts -namespace triage-dev ../overlays/dev/certs
//
// It writes DIR/ca.crt, DIR/ca.key and DIR/NAME/tls.crt and tls.key for
// shop, quota, quota-etcd-client and etcd, with the names each is reached
// at in the namespace and a SPIFFE identity per service account.
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
	}
}

func write(dir, ns string) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "triage dev CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(90 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "ca.crt"), "CERTIFICATE", caDER); err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, "ca.key"), caKey); err != nil {
		return err
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
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
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
