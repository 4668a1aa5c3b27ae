#!/bin/bash
# share.sh LOAD [SIDECAR FLAGS...]: what triage sidecar takes of the core
# it shares with the Python upstream (upstream.py, 30,000 sha256 rounds a
# request, C about 100/s here), both on CPU 0, with triage loadtest on CPU
# 1 offering LOAD x 100 requests a second for 8 s through the sidecar.
# Prints the sidecar's and the upstream's CPU over the step (from /proc),
# the sidecar's context switches a second (every thread's, voluntary and
# not) and the step's goodput. TRIAGE is the triage binary (default:
# triage on PATH). Ports 18000 and 18080 on loopback.
#
#	TRIAGE=/tmp/triage bash bench/polyglot/share.sh 10
#	TRIAGE=/tmp/triage bash bench/polyglot/share.sh 10 -quiet-sysmon=false
set -euo pipefail
load=$1
shift
triage=${TRIAGE:-triage}
dir=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
taskset -c 0 python3 "$dir/upstream.py" 18000 30000 >"$out/upstream.log" 2>&1 &
up=$!
trap 'kill $up ${sc:-} 2>/dev/null; wait 2>/dev/null; rm -rf "$out"' EXIT
sleep 1.5
GOMAXPROCS=1 taskset -c 0 "$triage" sidecar -upstream http://127.0.0.1:18000 -listen 127.0.0.1:18080 \
  -trust 127.0.0.1/32 "$@" >"$out/sidecar.log" 2>&1 &
sc=$!
sleep 1
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
switches() { cat /proc/"$1"/task/*/status | awk '/ctxt_switches/{s+=$2} END{print s}'; }
t0=$(ticks $sc) u0=$(ticks $up) s0=$(switches $sc) w0=$(date +%s.%N)
taskset -c 1 "$triage" loadtest -url http://127.0.0.1:18080/ -capacity 100 -loads "$load" -step 8s -out "$out/step" \
  >/dev/null 2>"$out/loadtest.log" || { cat "$out/loadtest.log" >&2; exit 1; }
t1=$(ticks $sc) u1=$(ticks $up) s1=$(switches $sc) w1=$(date +%s.%N)
python3 - "$out/step/result.json" "$t0" "$t1" "$u0" "$u1" "$s0" "$s1" "$w0" "$w1" "$(getconf CLK_TCK)" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t0, t1, u0, u1, s0, s1, w0, w1, hz = map(float, sys.argv[2:])
el = w1 - w0
step = r["steps"][0]
print(f"sidecar CPU {100*(t1-t0)/hz/el:.1f}%  upstream CPU {100*(u1-u0)/hz/el:.1f}%  "
      f"sidecar context switches {(s1-s0)/el:.0f}/s  goodput {step['goodput']:.2f}")
PY
