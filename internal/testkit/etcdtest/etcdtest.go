// Package etcdtest starts a real etcd server (the etcd binary on PATH,
// Debian's etcd-server package; .ci/run installs it) on loopback for a
// test; where there is none it skips the test, or fails it under CI=true.
package etcdtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Server is one etcd process.
type Server struct {
	Endpoint string // http://127.0.0.1:PORT, or https:// (StartTLS)
	cmd      *exec.Cmd
	tls      *tls.Config // the test's client's, with StartTLS
}

func freePort(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Start starts etcd for the test, with its data in a temporary directory,
// and waits until it answers; the process is killed when the test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return start(tb, nil)
}

// TLS names the PEM files of an etcd that speaks TLS to its clients and
// requires their certificates (verified against CA), and the client pair
// the test's own client (Server.Client) presents.
type TLS struct {
	Cert, Key, CA         string // the server's
	ClientCert, ClientKey string // the test's client's
}

// StartTLS starts etcd as Start does, serving https and requiring client
// certificates that f.CA verifies.
func StartTLS(tb testing.TB, f TLS) *Server {
	tb.Helper()
	return start(tb, &f)
}

func start(tb testing.TB, f *TLS) *Server {
	tb.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatal("etcd not found; .ci/run installs Debian's etcd-server package")
		}
		tb.Skip("etcd is not installed (apt-get install etcd-server)")
	}
	scheme := "http://"
	var extra []string
	s := &Server{}
	if f != nil {
		scheme = "https://"
		extra = []string{"--cert-file", f.Cert, "--key-file", f.Key, "--trusted-ca-file", f.CA, "--client-cert-auth"}
		pair, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
		if err != nil {
			tb.Fatal(err)
		}
		ca, err := os.ReadFile(f.CA)
		if err != nil {
			tb.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		s.tls = &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	client, peer := scheme+freePort(tb), "http://"+freePort(tb)
	cmd := exec.Command(bin, append([]string{"--name", "t", "--data-dir", tb.TempDir(),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "t=" + peer, "--log-level", "error"}, extra...)...)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	s.Endpoint, s.cmd = client, cmd
	tb.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	cli := s.Client(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, "ready"); err != nil {
		tb.Fatalf("etcd did not answer within 20 s: %v", err)
	}
	return s
}

// Client returns a client of s, closed when the test ends.
func (s *Server) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: s.tls})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// Pause stops the etcd process (SIGSTOP): it holds its connections and
// answers nothing until Resume.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused etcd (SIGCONT).
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	if err := s.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("etcdtest: %w", err)
	}
	return nil
}

// Proxy relays TCP connections to an etcd server until Cut, so that a
// test can take one client off etcd at once, as a crash of its process
// would: nothing it sends afterwards reaches etcd.
type Proxy struct {
	Endpoint string // http://127.0.0.1:PORT, to give a client
	lis      net.Listener
	mu       sync.Mutex
	conns    []net.Conn
	cut      bool
}

// NewProxy starts a proxy to s, stopped when the test ends.
func (s *Server) NewProxy(tb testing.TB) *Proxy {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	target := strings.TrimPrefix(s.Endpoint, "http://")
	p := &Proxy{Endpoint: "http://" + lis.Addr().String(), lis: lis}
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				c.Close()
				up.Close()
				continue
			}
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
	tb.Cleanup(p.Cut)
	return p
}

// Cut closes every relayed connection and refuses new ones.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.lis.Close()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Client returns a client of the server through p, closed when the test ends.
func (p *Proxy) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}
