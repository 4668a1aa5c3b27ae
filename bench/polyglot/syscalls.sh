#!/bin/bash
# syscalls.sh UPSTREAM LOAD OUT [SIDECAR FLAGS...]: the sidecar's system
# calls per request in one load step, by strace -c over 4 s of it.
#
# UPSTREAM is python, gunicorn or node, as in trace.sh; the upstream and
# the sidecar share CPU 0, triage loadtest runs on CPU 1: it probes the
# upstream's capacity C directly, then offers LOAD x C through the sidecar
# for 8 s, strace attached from its third second to its seventh. OUT gets
# strace's table (strace.txt) and the step's result.json; the last line
# printed is the calls per request of each system call. strace slows the
# sidecar: read the goodput of this step as strace's, not the sidecar's.
# TRIAGE is the triage binary (default: triage on PATH). Ports 18000 and
# 18080 on loopback.
set -euo pipefail
up=$1 load=$2 out=$3
shift 3
triage=${TRIAGE:-triage}
dir=$(cd "$(dirname "$0")" && pwd)
command -v strace >/dev/null || { echo "syscalls.sh needs strace (apt-get install strace)" >&2; exit 2; }
rm -rf "$out" && mkdir -p "$out"
. "$dir/lib.sh"
start_upstream "$up" "$out"
trap 'kill $upstream ${sidecar:-} 2>/dev/null; wait 2>/dev/null' EXIT
sleep 1.5
c=$(probe_capacity "$out")
start_sidecar "$out" "$@"
sleep 1
(sleep 2; timeout -s INT 4 strace -c -f -p $sidecar -o "$out/strace.txt" 2>/dev/null || true) &
tracer=$!
taskset -c 1 "$triage" loadtest -url http://127.0.0.1:18080/ -capacity "$c" -loads "$load" -step 8s -out "$out/step" >/dev/null
wait $tracer
python3 - "$out/strace.txt" "$c" "$load" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l[:1] == " " and l.split()[0][0].isdigit()]
reqs = float(sys.argv[2]) * float(sys.argv[3]) * 4  # the 4 s traced
per = []
for f in rows:
    name = f[-1]
    if name == "total":
        continue
    calls = int(f[3])
    errs = int(f[4]) if len(f) == 6 else 0
    per.append("%s %.2f%s" % (name, calls / reqs, " (%.2f failed)" % (errs / reqs) if errs else ""))
print("C %.0f/s, %.0f requests traced; per request: %s" % (float(sys.argv[2]), reqs, ", ".join(per[:6])))
PY
