"""A WSGI service nobody here wrote, for triage's polyglot benchmark, run
the way most Python services run: under gunicorn's sync workers, each
request spending some CPU and then waiting on I/O (a database call,
say), so that the service's concurrency is its worker count, not its
cores.

    ROUNDS=15000 IO_MS=20 gunicorn --workers 3 --bind 127.0.0.1:PORT \
        --chdir bench/polyglot wsgi:app

Each request burns ROUNDS sha256 hashes, then sleeps IO_MS milliseconds,
and answers 200 echoing the Triage-Criticality header it was given.
"""
import hashlib
import os
import time

ROUNDS = int(os.environ.get("ROUNDS", "15000"))
IO_S = float(os.environ.get("IO_MS", "20")) / 1000


def app(environ, start_response):
    body = environ.get("wsgi.input")
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if body is not None and length > 0:
        body.read(length)
    h = b"x"
    for _ in range(ROUNDS):
        h = hashlib.sha256(h).digest()
    time.sleep(IO_S)
    headers = [("Content-Type", "text/plain"), ("Content-Length", "3")]
    crit = environ.get("HTTP_TRIAGE_CRITICALITY")
    if crit:
        headers.append(("Triage-Criticality", crit))
    start_response("200 OK", headers)
    return [b"ok\n"]
