#!/usr/bin/env bash
# bench/ceiling.sh [OUTDIR] - gemmd against the ceiling of its own HTTP library, in one run.
#
# For each size in SIZES (default "64 256 1024") and connection count in CONNS (default
# "1 64 256") it runs wrk (Debian's `wrk`) for DURATION seconds (default 10) against
#   bare   build/bench/bare_mhd: libmicrohttpd with the daemon's threading (HTTP_THREADS,
#          default the daemon's own default: half the CPUs, 4 to 16) and connection buffer (CONN_MEMORY_KB,
#          default the daemon's default connection_memory_kb, 64) that reads the body and answers with the
#          C-sized bytes of zeros - no decoding, no engine;
#   gemmd  $GEMMD (default bin/gemmd; BACKEND, default auto: CUDA when a GPU is present),
#          raw float32, kernel $KERNEL (default auto), its config $GEMMD_CONF (default
#          config/gemmd.conf);
# with the same body (A then B, raw float32, values in [-1, 1)) and the same answer size,
# and prints a Markdown table: requests/s, p50, p99 for each, and gemmd / bare.
#
# Before the cells of each size, both servers get WARMUP seconds (default 2) of the same
# load at 4 connections, not recorded: first requests pay for things done once (the
# daemon's first products load kernels, unless its workers warmed up at start), and the
# figures are of a server that has run a while.
#
# wrk's latency percentiles are corrected for coordinated omission: for every answer that
# took longer than twice the mean interval between requests, wrk adds the answers a
# constant-rate client would have waited for meanwhile. At one connection and ~5,000 req/s
# a single 100 ms stall thus adds ~500 samples and moves p99 to ~100 ms. That is the right
# measure of a stall, but it is not the latency of 1% of the requests; `gemm bench -c 1`
# (bench/daemon_latency.sh) reports those.
#
# The daemon runs with per_ip_limit 0 and connection_limit above the largest CONNS, so one
# loopback source address is enough; everything else is its default. Non-200 answers are
# counted and shown (a column that is not 0 means the figure is not a throughput of products).
set -u
cd "$(dirname "$0")/.."
out=${1:-bench/out/ceiling}
mkdir -p "$out"
sizes=${SIZES:-64 256 1024}
conns=${CONNS:-1 64 256}
dur=${DURATION:-10}
warm=${WARMUP:-2}
cpus=$(nproc)
threads=${HTTP_THREADS:-$(( cpus / 2 < 4 ? 4 : cpus / 2 > 16 ? 16 : cpus / 2 ))}
backend=${BACKEND:-auto}
gemmd=${GEMMD:-bin/gemmd}
gemmd_conf=${GEMMD_CONF:-config/gemmd.conf}
WRK=${WRK:-$(command -v wrk || { test -x /tmp/deps/usr/bin/wrk && echo /tmp/deps/usr/bin/wrk; })}
if [ -z "$WRK" ]; then
    echo "ceiling.sh: wrk not found; install it: sudo apt-get install -y wrk" >&2
    exit 2
fi
[ -x build/bench/bare_mhd ] && [ -x "$gemmd" ] || make -s bench >/dev/null || exit 1
maxc=0
for c in $conns; do [ "$c" -gt "$maxc" ] && maxc=$c; done
limit=$((maxc + 64))
nproc=$(nproc)

. bench/loopback.sh # free_port, wait_up, float32_body

bport=$(free_port)
start_bare "$out/bare.log" "$bport" "$threads" "$limit"
bpid=$!
gport=$(free_port)
start_gemmd "$out/gemmd.log" "$gemmd" "$gport" "$threads" "$limit"
gpid=$!
trap 'kill $bpid $gpid 2>/dev/null; wait $bpid $gpid 2>/dev/null' EXIT
wait_up "http://127.0.0.1:$bport" || { echo "bare_mhd did not start"; cat "$out/bare.log"; exit 1; }
wait_up "http://127.0.0.1:$gport" || { echo "gemmd did not start"; cat "$out/gemmd.log"; exit 1; }
curl -fsS "http://127.0.0.1:$gport/v1/info" >"$out/info.json"

. bench/wrk_run.sh # to_us, run_wrk

echo "# gemmd vs a bare libmicrohttpd server (the ceiling), raw float32"
echo
echo "host: $(hostname), $(nproc) cores; $(python3 -c 'import json,sys; i=json.load(open(sys.argv[1])); print("backend", i.get("backend"), "-", ", ".join(d.get("name","?") for d in i.get("devices",[])) or "no devices")' "$out/info.json" 2>/dev/null)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD 2>/dev/null); wrk $("$WRK" -v 2>&1 | head -1 | awk '{print $2}')"
echo "daemon: $gemmd ($gemmd_conf)"
echo "command: SIZES=\"$sizes\" CONNS=\"$conns\" DURATION=$dur WARMUP=$warm HTTP_THREADS=$threads BACKEND=$backend bench/ceiling.sh"
echo
echo "| size | conns | bare req/s | bare p50 µs | bare p99 µs | gemmd req/s | gemmd p50 µs | gemmd p99 µs | gemmd non-200 | gemmd / bare |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for n in $sizes; do
    body=$out/body-$n.bin
    float32_body "$n" "$body"
    q="?m=$n&k=$n&n=$n&dtype=float32"
    gq="$q${KERNEL:+&kernel=$KERNEL}"
    if [ "$warm" -gt 0 ]; then
        WRK_BODY=$body "$WRK" -t 1 -c 4 -d "${warm}s" -s bench/wrk_post.lua "http://127.0.0.1:$bport/v1/matmul$q" >"$out/warmup.log" 2>&1
        WRK_BODY=$body "$WRK" -t 1 -c 4 -d "${warm}s" -s bench/wrk_post.lua "http://127.0.0.1:$gport/v1/matmul$gq" >"$out/warmup.log" 2>&1
    fi
    for c in $conns; do
        read -r brps bp50 bp99 _ < <(run_wrk "http://127.0.0.1:$bport/v1/matmul$q" "$body" "$c" "$out/bare-$n-$c.log")
        read -r grps gp50 gp99 gbad < <(run_wrk "http://127.0.0.1:$gport/v1/matmul$gq" "$body" "$c" "$out/gemmd-$n-$c.log")
        ratio=$(awk -v g="$grps" -v b="$brps" 'BEGIN { if (b > 0) printf "%.1f%%", 100 * g / b; else print "-" }')
        printf '| %s² | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %s | %s |\n' \
            "$n" "$c" "$brps" "$bp50" "$bp99" "$grps" "$gp50" "$gp99" "$gbad" "$ratio"
    done
done
