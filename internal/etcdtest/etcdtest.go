// Package etcdtest starts a real etcd server (the etcd binary on PATH,
// Debian's etcd-server package; .ci/run installs it) on loopback for a
// test; where there is none it skips the test, or fails it under CI=true.
package etcdtest

import (
	"context"
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
	Endpoint string // http://127.0.0.1:PORT
	cmd      *exec.Cmd
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
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatal("etcd not found; .ci/run installs Debian's etcd-server package")
		}
		tb.Skip("etcd is not installed (apt-get install etcd-server)")
	}
	client, peer := "http://"+freePort(tb), "http://"+freePort(tb)
	cmd := exec.Command(bin, "--name", "t", "--data-dir", tb.TempDir(),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "t="+peer, "--log-level", "error")
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	s := &Server{Endpoint: client, cmd: cmd}
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
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
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
