#!/usr/bin/env bash
# bench/fleet_nginx.sh [OUTDIR] - several daemons behind nginx (config/nginx/gemmd.conf),
# measured with wrk (Debian's `wrk`) and printed as a Markdown table. Two measurements:
#
#  1. Scale-out: SMALL² float32 products (default 512) at CONNS_SMALL connections (24) on
#     the CPU backend: one daemon directly, one daemon behind nginx, three daemons behind
#     nginx; every daemon alike (THREADS BLAS threads, default (cores - 4) / 3, leaving
#     cores to nginx and wrk; cpu_workers 1). A fourth row gives one daemon all of those
#     cores (THREADS x 3) for reference. Target: three behind nginx >= 2.5x one direct.
#  2. nginx's cost: BIG² float32 products (default 4096) at CONNS_BIG connections (8) on one
#     daemon of BACKEND (default cuda): directly, and behind nginx. Target: <= 10% fewer
#     products/s behind nginx.
#
# Bodies are raw float32 (A then B), the answers raw C; every run counts the answers that
# are not 200 (a row with non-200 > 0 is not a throughput of products). nginx runs in the
# foreground with its own prefix, config, logs and temp folders under OUTDIR (no root):
# the recipe as shipped, only its addresses changed (and, for one daemon, the other
# servers left out), worker_processes NGINX_WORKERS (default 4).
#
# Environment: SMALL, BIG, CONNS_SMALL, CONNS_BIG, DURATION (seconds a run, default 15),
# THREADS, BACKEND, NGINX (path), WRK (path), WRK_THREADS (default 4), ONLY=1|2.
# Without nginx or wrk: sudo apt-get install -y nginx wrk (or carried .debs unpacked with
# dpkg -x into /tmp/deps: then NGINX=/tmp/deps/usr/sbin/nginx WRK=/tmp/deps/usr/bin/wrk).
set -u
cd "$(dirname "$0")/.."
out=${1:-bench/out/fleet_nginx}
mkdir -p "$out"
out=$(cd "$out" && pwd)
small=${SMALL:-512}
big=${BIG:-4096}
cs=${CONNS_SMALL:-24}
cb=${CONNS_BIG:-8}
dur=${DURATION:-15}
backend=${BACKEND:-cuda}
only=${ONLY:-}
nproc=$(nproc)
threads=${THREADS:-$(((nproc - 4) / 3))}
[ "$threads" -ge 1 ] || threads=1
wrk_threads=${WRK_THREADS:-4}
workers=${NGINX_WORKERS:-4}
NGINX=${NGINX:-$(command -v nginx || { for p in /usr/sbin/nginx /tmp/deps/usr/sbin/nginx; do [ -x "$p" ] && echo "$p" && break; done; })}
WRK=${WRK:-$(command -v wrk || { test -x /tmp/deps/usr/bin/wrk && echo /tmp/deps/usr/bin/wrk; })}
[ -n "$WRK" ] || { echo "fleet_nginx.sh: wrk not found; install it: sudo apt-get install -y wrk" >&2; exit 2; }
[ -n "$NGINX" ] || { echo "fleet_nginx.sh: nginx not found; install it: sudo apt-get install -y nginx" >&2; exit 2; }
[ -x bin/gemmd ] || make -s build >/dev/null || exit 1

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    pids=()
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 600); do curl -fsS "$1/healthz" >/dev/null 2>&1 && return 0; sleep 0.05; done; return 1; }

# start_daemon NAME BACKEND THREADS: sets $port; the pid goes to pids (so: never in $(...)).
start_daemon() {
    port=$(free_port)
    bin/gemmd --config config/gemmd.conf --backend "$2" --threads "$3" --cpu-workers 1 --port "$port" \
        --instance-id "$1" --per-ip-limit 0 --connection-limit 512 --queue-depth 1024 --log-level warn \
        >"$out/$1.log" 2>&1 &
    pids+=($!)
    wait_up "http://127.0.0.1:$port" || { echo "fleet_nginx.sh: gemmd $1 did not start:" >&2; cat "$out/$1.log" >&2; exit 1; }
}

# start_nginx DIR PORT... (the daemons' ports, 1 to 3): sets $port to nginx's.
start_nginx() {
    local dir=$1 lport
    shift
    lport=$(free_port)
    mkdir -p "$dir/temp"
    python3 - config/nginx/gemmd.conf "$dir" "$lport" "$workers" "$@" <<'PY' || exit 1
import re, sys
recipe, d, listen, workers, ports = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
text = open(recipe).read()
names = ["8081", "8082", "8083"]
for i, name in enumerate(names):
    if i < len(ports):
        text, n = re.subn(r"\bserver 127\.0\.0\.1:%s\b" % name, "server 127.0.0.1:%s" % ports[i], text)
    else:  # fewer daemons: leave this one out of the balanced group (its own group stays)
        text, n = re.subn(r"^\s*server 127\.0\.0\.1:%s max_fails[^\n]*\n" % name, "", text, flags=re.M)
        n += 1
    assert n == 2, "recipe: unexpected server lines for %s" % name
text, n = re.subn(r"^(\s*)listen 8080;", r"\1listen 127.0.0.1:%s;" % listen, text, flags=re.M)
assert n == 1, "recipe: no 'listen 8080;'"
open(d + "/gemmd-recipe.conf", "w").write(text)
open(d + "/nginx.conf", "w").write("""daemon off;
worker_processes %s;
pid %s/nginx.pid;
error_log %s/error.log warn;
events { worker_connections 4096; }
http {
    client_body_temp_path %s/temp/body; proxy_temp_path %s/temp/proxy; fastcgi_temp_path %s/temp/fastcgi;
    uwsgi_temp_path %s/temp/uwsgi; scgi_temp_path %s/temp/scgi;
    access_log off;
    include %s/gemmd-recipe.conf;
}
""" % (workers, d, d, d, d, d, d, d, d))
PY
    "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" >"$dir/stdout.log" 2>&1 &
    pids+=($!)
    wait_up "http://127.0.0.1:$lport" || { echo "fleet_nginx.sh: nginx did not start:" >&2; cat "$dir/error.log" >&2; exit 1; }
    port=$lport
}

make_body() { # N FILE: A then B, N x N float32 each, values in [-1, 1)
    [ -s "$2" ] && return 0
    python3 - "$1" "$2" <<'PY'
import sys
n, path = int(sys.argv[1]), sys.argv[2]
try:
    import numpy as np
    np.random.default_rng(n).uniform(-1, 1, size=2 * n * n).astype("<f4").tofile(path)
except ImportError:
    import array, random
    rnd = random.Random(n)
    block = array.array("f", (rnd.uniform(-1, 1) for _ in range(1 << 16))).tobytes()
    total = 2 * n * n * 4
    with open(path, "wb") as f:
        while total > 0:
            f.write(block[:total]); total -= len(block)
PY
}

wrk_timeout=60s
. bench/wrk_run.sh # to_us, run_wrk (wrk_threads, wrk_timeout)

row() { # SETUP DAEMONS THREADS SIZE CONNS URL BODY LOG -> prints the row, sets last_rps
    local r p50 p99 bad
    read -r r p50 p99 bad < <(run_wrk "$6" "$7" "$5" "$8")
    last_rps=$r
    printf '| %s | %s | %s | %s² | %s | %.1f | %.2f | %.2f | %s |\n' "$1" "$2" "$3" "$4" "$5" "$r" \
        "$(awk -v u="$p50" 'BEGIN { print u / 1000 }')" "$(awk -v u="$p99" 'BEGIN { print u / 1000 }')" "$bad"
}

echo "# gemmd behind nginx (config/nginx/gemmd.conf)"
echo
echo "host: $(hostname), $nproc cores; $("$NGINX" -v 2>&1 | sed 's/.*version: //'); wrk $("$WRK" -v 2>&1 | head -1 | awk '{print $2}')"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD 2>/dev/null)"
echo "command: SMALL=$small BIG=$big CONNS_SMALL=$cs CONNS_BIG=$cb DURATION=$dur THREADS=$threads BACKEND=$backend NGINX_WORKERS=$workers WRK_THREADS=$wrk_threads bench/fleet_nginx.sh"
echo
echo "| setup | daemons | BLAS threads each | size | conns | products/s | p50 ms | p99 ms | non-200 |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"

q_small="?m=$small&k=$small&n=$small&dtype=float32"
q_big="?m=$big&k=$big&n=$big&dtype=float32"
summary=()
if [ "$only" != 2 ]; then
    make_body "$small" "$out/body-$small.bin"
    rm -f "$out/spread.txt"
    start_daemon gemmd-a cpu "$threads"; pa=$port
    row "CPU, direct" 1 "$threads" "$small" "$cs" "http://127.0.0.1:$pa/v1/matmul$q_small" "$out/body-$small.bin" "$out/s-direct.log"
    one=$last_rps
    start_nginx "$out/nginx-1" "$pa"; n1=$port
    row "CPU, nginx" 1 "$threads" "$small" "$cs" "http://127.0.0.1:$n1/v1/matmul$q_small" "$out/body-$small.bin" "$out/s-nginx1.log"
    cleanup
    start_daemon gemmd-a cpu "$threads"; pa=$port
    start_daemon gemmd-b cpu "$threads"; pb=$port
    start_daemon gemmd-c cpu "$threads"; pc=$port
    start_nginx "$out/nginx-3" "$pa" "$pb" "$pc"; n3=$port
    row "CPU, nginx" 3 "$threads" "$small" "$cs" "http://127.0.0.1:$n3/v1/matmul$q_small" "$out/body-$small.bin" "$out/s-nginx3.log"
    three=$last_rps
    for n in a b c; do
        p=$(eval echo "\$p$n")
        printf '%s ' "gemmd-$n: $(curl -fsS "http://127.0.0.1:$p/metrics" | awk '/^gemmd_requests_total\{route="\/v1\/matmul",code="200"\}/ {print $2}') products;" >>"$out/spread.txt"
    done
    cleanup
    start_daemon gemmd-a cpu $((threads * 3)); pa=$port
    row "CPU, direct (3x the threads)" 1 $((threads * 3)) "$small" "$cs" "http://127.0.0.1:$pa/v1/matmul$q_small" "$out/body-$small.bin" "$out/s-direct-wide.log"
    cleanup
    summary+=("three daemons behind nginx / one direct at ${small}², $cs connections: $(awk -v a="$three" -v b="$one" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }') (target >= 2.5x); spread: $(cat "$out/spread.txt" 2>/dev/null)")
fi
if [ "$only" != 1 ]; then
    make_body "$big" "$out/body-$big.bin"
    start_daemon gemmd-a "$backend" 0; pa=$port
    dev=$(curl -fsS "http://127.0.0.1:$pa/v1/info" | python3 -c 'import json,sys; i=json.load(sys.stdin); print(i.get("backend"), "-", ", ".join(d.get("name","?") for d in i.get("devices",[])))' 2>/dev/null)
    row "$backend, direct" 1 - "$big" "$cb" "http://127.0.0.1:$pa/v1/matmul$q_big" "$out/body-$big.bin" "$out/b-direct.log"
    direct=$last_rps
    start_nginx "$out/nginx-big" "$pa"; n1=$port
    row "$backend, nginx" 1 - "$big" "$cb" "http://127.0.0.1:$n1/v1/matmul$q_big" "$out/body-$big.bin" "$out/b-nginx.log"
    proxied=$last_rps
    cleanup
    summary+=("nginx in front of one daemon ($dev) at ${big}², $cb connections: $(awk -v a="$proxied" -v b="$direct" 'BEGIN { if (b > 0) printf "%.1f%% fewer products/s", 100 * (1 - a / b); else print "-" }') (target <= 10%)")
fi
echo
for s in "${summary[@]}"; do echo "- $s"; done
