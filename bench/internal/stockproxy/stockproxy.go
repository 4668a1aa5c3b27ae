// Package stockproxy writes the configurations of the stock proxies the
// benchmarks put in front of a service beside triage's sidecar (nginx and
// HAProxy, tuned as their documentation allows) and returns their command
// lines. Each runs one worker or thread, in the foreground, with its files
// in the directory it is given.
package stockproxy

import (
	"fmt"
	"os"
	"path/filepath"
	"text/template"
	"time"
)

// Config is a stock proxy in front of one upstream.
type Config struct {
	Upstream string // host:port of the service
	Listen   string // host:port the proxy listens on
	Dir      string // where its configuration, logs and temporary files go

	// nginx: limit_req at Rate a second with a burst of Burst (Rate 0:
	// none), and limit_conn at Conns, both answering 503 at once.
	Rate, Burst, Conns int

	// HAProxy: at most Maxconn requests at the upstream at once, the rest
	// queued for at most Queue, ordered by priority classes set from the
	// criticality header.
	Maxconn int
	Queue   time.Duration

	// GRPC says the upstream speaks gRPC: the proxy takes HTTP/2 in
	// cleartext and passes it on as HTTP/2 (nginx's grpc_pass, HAProxy's
	// proto h2 both ways).
	GRPC bool
}

// Argv writes proxy's configuration ("nginx" or "haproxy") into c.Dir and
// returns its command line.
func Argv(proxy string, c Config) ([]string, error) {
	tmpl, ok := map[string]string{"nginx": nginxConf, "haproxy": haproxyConf}[proxy]
	if !ok {
		return nil, fmt.Errorf("stockproxy: unknown proxy %q", proxy)
	}
	if c.Upstream == "" || c.Listen == "" || c.Dir == "" {
		return nil, fmt.Errorf("stockproxy: %s needs an upstream, an address to listen on and a directory", proxy)
	}
	if err := os.MkdirAll(filepath.Join(c.Dir, "tmp"), 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(c.Dir, proxy+".conf")
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	data := struct {
		Config
		QueueMS int64
	}{c, max(c.Queue.Milliseconds(), 1)}
	err = template.Must(template.New(proxy).Parse(tmpl)).Execute(f, data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if proxy == "haproxy" {
		return []string{"haproxy", "-db", "-f", path}, nil
	}
	return []string{"nginx", "-p", c.Dir, "-c", path, "-g", "daemon off;"}, nil
}

// nginxConf: one worker; keep-alive connections to the upstream;
// limit_req and limit_conn answering 503 at once. The zones are keyed by
// the server's name, which is set: nginx does not count a request whose
// key is empty, as $server_name is in a server block without one.
const nginxConf = `worker_processes 1;
pid {{.Dir}}/nginx.pid;
error_log {{.Dir}}/nginx-error.log warn;
events { worker_connections 16384; }
http {
  access_log off;
  client_body_temp_path {{.Dir}}/tmp; proxy_temp_path {{.Dir}}/tmp;
  fastcgi_temp_path {{.Dir}}/tmp; uwsgi_temp_path {{.Dir}}/tmp; scgi_temp_path {{.Dir}}/tmp;
  keepalive_requests 100000;
{{- if .Rate}}
  limit_req_zone $server_name zone=rate:1m rate={{.Rate}}r/s;
{{- end}}
  limit_conn_zone $server_name zone=conns:1m;
  upstream app { server {{.Upstream}}; keepalive 64; }
  server {
    listen {{.Listen}} backlog=4096{{if .GRPC}} http2{{end}};
    server_name bench;
    location / {
{{- if .Rate}}
      limit_req zone=rate burst={{.Burst}} nodelay;
      limit_req_status 503;
{{- end}}
      limit_conn conns {{.Conns}};
      limit_conn_status 503;
{{- if .GRPC}}
      grpc_read_timeout 90s;
      grpc_pass grpc://app;
{{- else}}
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_read_timeout 90s;
      proxy_pass http://app;
{{- end}}
    }
  }
}
`

// haproxyConf: one thread; keep-alive both ways; the upstream's
// concurrency capped by maxconn, the rest in HAProxy's queue for at most
// the queue timeout, ordered by priority classes from the criticality
// header (set-priority-class), so that HAProxy too serves CRITICAL first.
const haproxyConf = `global
  maxconn 8000
  nbthread 1
defaults
  mode http
  timeout connect 1s
  timeout client 90s
  timeout server 90s
  timeout queue {{.QueueMS}}ms
  option http-keep-alive
frontend fe
  bind {{.Listen}}{{if .GRPC}} proto h2{{end}}
  http-request set-priority-class int(-2) if { req.hdr(triage-criticality) -m str CRITICAL_PLUS }
  http-request set-priority-class int(-1) if { req.hdr(triage-criticality) -m str CRITICAL }
  http-request set-priority-class int(1) if { req.hdr(triage-criticality) -m str SHEDDABLE_PLUS }
  http-request set-priority-class int(2) if { req.hdr(triage-criticality) -m str SHEDDABLE }
  default_backend app
backend app
  http-reuse always
  server up {{.Upstream}} maxconn {{.Maxconn}}{{if .GRPC}} proto h2{{end}}
`
