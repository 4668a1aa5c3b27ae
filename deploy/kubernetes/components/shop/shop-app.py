"""A Python service nobody here wrote, for triage's polyglot benchmark.

The standard library's ThreadingHTTPServer (a thread per connection, as a
small Python service is often run), each GET burning a calibrated amount of
CPU: ROUNDS sha256 hashes. It reads and answers triage's headers only by
echoing the criticality it was given.

    python3 upstream.py PORT [ROUNDS [DOWNSTREAM_URL]]

With DOWNSTREAM_URL it is a middle tier: each request then calls
DOWNSTREAM_URL once, copying the Triage-Criticality and Triage-Customer
headers it received onto the call (the one duty a service behind triage
sidecar has), and answers a refusal from downstream with its status and
Triage-Outcome and Retry-After headers.
"""
import hashlib
import http.client
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 10000
DOWNSTREAM = urllib.parse.urlsplit(sys.argv[3]) if len(sys.argv) > 3 else None
PROPAGATED = ("Triage-Criticality", "Triage-Customer")
PASSED_UP = ("Triage-Outcome", "Retry-After")
local = threading.local()


def call_downstream(headers):
    """GET DOWNSTREAM with the propagated headers, on this thread's
    keep-alive connection: (status, headers to pass up)."""
    for attempt in range(2):  # a connection the other side closed: once more, on a new one
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection(DOWNSTREAM.hostname, DOWNSTREAM.port, timeout=2)
        try:
            conn.request("GET", DOWNSTREAM.path or "/", headers={k: headers[k] for k in PROPAGATED if headers.get(k)})
            resp = conn.getresponse()
            resp.read()
            return resp.status, {k: resp.getheader(k) for k in PASSED_UP if resp.getheader(k)}
        except (http.client.HTTPException, OSError):
            conn.close()
            local.conn = None
    return 502, {}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # One write per response, without Nagle: otherwise every answer waits
    # for the client's delayed ACK (40 ms) between headers and body.
    wbufsize = -1
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def drain_body(self):
        # Read the body a request came with, whatever its method: left
        # unread, a keep-alive connection would parse it as the next
        # request. A body that cannot be read so ends the connection.
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = -1
        if n > 0:
            self.rfile.read(n)
        if n < 0 or "Transfer-Encoding" in self.headers:
            self.close_connection = True

    def do_GET(self):
        self.drain_body()
        if self.path == "/healthz":  # the sidecar's -upstream-ready, the liveness probe
            self.send_response(200)
            self.send_header("Content-Length", "3")
            self.end_headers()
            self.wfile.write(b"ok\n")
            return
        if DOWNSTREAM is not None:
            status, up = call_downstream(self.headers)
            if status != 200:
                self.send_response(status)
                for k, v in up.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        h = b"x"
        for _ in range(ROUNDS):
            h = hashlib.sha256(h).digest()
        body = h.hex()[:16].encode() + b"\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        crit = self.headers.get("Triage-Criticality")
        if crit:
            self.send_header("X-Served-Criticality", crit)
        self.end_headers()
        self.wfile.write(body)


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer.request_queue_size = 1024
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
