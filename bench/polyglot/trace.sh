#!/bin/bash
# trace.sh UPSTREAM LOAD OUT [SIDECAR FLAGS...]: one load step through
# triage sidecar, with the sidecar's admission state read every 250 ms.
#
# UPSTREAM is python (upstream.py, 30,000 sha256 rounds a request),
# gunicorn (wsgi.py under 3 sync workers, 5,000 rounds then 20 ms of I/O
# wait) or node (upstream.js, 40,000 PBKDF2 iterations). The upstream and the sidecar share CPU 0; triage loadtest runs on
# CPU 1: it probes the upstream's capacity C directly, then offers LOAD x C
# through the sidecar for 8 s. OUT gets the probe's and the step's
# result.json and metrics.log (executing, limit, queued and service time,
# one line per reading). TRIAGE is the triage binary (default: triage on
# PATH). Ports 18000, 18080 and 18090 on loopback.
set -euo pipefail
up=$1 load=$2 out=$3
shift 3
triage=${TRIAGE:-triage}
dir=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out" && mkdir -p "$out"
. "$dir/lib.sh"
start_upstream "$up" "$out"
trap 'kill $upstream ${sidecar:-} ${reader:-} 2>/dev/null; wait 2>/dev/null' EXIT
sleep 1.5
c=$(probe_capacity "$out")
start_sidecar "$out" -metrics 127.0.0.1:18090 "$@"
sleep 1
while kill -0 $sidecar 2>/dev/null; do
  echo "$(date +%s.%N) $(curl -s 127.0.0.1:18090/metrics | grep -E '^triage_admission_(limit|executing|queued|service_seconds|rejected_total)' | tr '\n' ' ')"
  sleep 0.25
done >"$out/metrics.log" 2>/dev/null &
reader=$!
taskset -c 1 "$triage" loadtest -url http://127.0.0.1:18080/ -capacity "$c" -loads "$load" -step 8s -out "$out/step" >/dev/null
python3 - "$out/step/result.json" "$c" <<'PY'
import json, sys
st = json.load(open(sys.argv[1]))["steps"][0]
by = {b["criticality"]: round(b["success"], 2) for b in st["by_criticality"]}
print("C %.0f/s goodput %.2f p50 %.0f ms p99 %.0f ms answered %s" % (float(sys.argv[2]), st["goodput"], st["latency_ms"]["p50"], st["latency_ms"]["p99"], by))
PY
