# lib.sh: what trace.sh and syscalls.sh share, sourced by them. $dir is
# this directory, $triage the triage binary, both set by the caller.

# start_upstream UP OUT: UP on CPU 0, port 18000 on loopback, its output
# in OUT/upstream.log; sets $upstream to its pid. UP is python
# (upstream.py, 30,000 sha256 rounds a request), gunicorn (wsgi.py under
# 3 sync workers, 5,000 rounds then 20 ms of I/O wait) or node
# (upstream.js, 40,000 PBKDF2 iterations).
start_upstream() {
  case $1 in
  python) taskset -c 0 python3 "$dir/upstream.py" 18000 30000 >"$2/upstream.log" 2>&1 & ;;
  gunicorn) ROUNDS=5000 IO_MS=20 taskset -c 0 gunicorn --workers 3 --bind 127.0.0.1:18000 --chdir "$dir" wsgi:app >"$2/upstream.log" 2>&1 & ;;
  node) taskset -c 0 node "$dir/upstream.js" 18000 40000 >"$2/upstream.log" 2>&1 & ;;
  *) echo "unknown upstream $1" >&2; return 2 ;;
  esac
  upstream=$!
}

# probe_capacity OUT: the upstream's capacity C in requests a second, by
# triage loadtest's closed-loop probe from CPU 1 (its result in OUT/probe).
probe_capacity() {
  taskset -c 1 "$triage" loadtest -url http://127.0.0.1:18000/ -loads 0.1 -step 1s -out "$1/probe" >/dev/null
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['capacity_rps'])" "$1/probe/result.json"
}

# start_sidecar OUT [FLAGS...]: triage sidecar on CPU 0 (GOMAXPROCS=1) in
# front of the upstream, listening on 127.0.0.1:18080, loopback trusted;
# sets $sidecar to its pid.
start_sidecar() {
  local out=$1
  shift
  GOMAXPROCS=1 taskset -c 0 "$triage" sidecar -upstream http://127.0.0.1:18000 -listen 127.0.0.1:18080 \
    -trust 127.0.0.1/32 "$@" >"$out/sidecar.log" 2>&1 &
  sidecar=$!
}
