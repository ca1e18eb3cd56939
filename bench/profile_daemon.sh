#!/usr/bin/env bash
# bench/profile_daemon.sh [OUTDIR] - where a daemon under load spends its CPU, by thread.
#
# Starts gemmd ($GEMMD, default bin/gemmd; config $GEMMD_CONF, default config/gemmd.conf;
# BACKEND, default auto) with the thread model of bench/ceiling.sh, and for each connection
# count in CONNS (default "64 1") puts wrk on it (raw float32 products of SIZE x SIZE,
# default 64, for DURATION + 2 seconds, default 3) while `perf record -g` samples the
# daemon's threads for DURATION seconds. Prints, per count, the requests/s and, for the HTTP
# threads (MHD-worker) and the engine workers (gemm-worker), the TOP (default 40) symbols by
# their share of that thread kind's samples with what they call ("children"), then the HTTP
# threads' top symbols with the call chains that reach them (a futex wait or wake-up there
# names the lock that is contended). Before that, bench/thread_cpu.py gives the CPU time
# per request of each thread kind.
#
# perf comes from Debian's linux-perf (sudo apt-get install -y linux-perf); it needs
# kernel.perf_event_paranoid <= 2 for a process of one's own, or root. A benchmark:
# nothing is asserted. The figures of bench/results/h100-2026-11-26-direct.md (sections 4
# and 6) were taken with these commands.
set -u
cd "$(dirname "$0")/.."
out=${1:-bench/out/profile}
mkdir -p "$out"
n=${SIZE:-64}
conns=${CONNS:-64 1}
dur=${DURATION:-3}
top=${TOP:-40}
cpus=$(nproc)
threads=${HTTP_THREADS:-$(( cpus / 2 < 4 ? 4 : cpus / 2 > 16 ? 16 : cpus / 2 ))}
gemmd=${GEMMD:-bin/gemmd}
gemmd_conf=${GEMMD_CONF:-config/gemmd.conf}
WRK=${WRK:-$(command -v wrk || { test -x /tmp/deps/usr/bin/wrk && echo /tmp/deps/usr/bin/wrk; })}
PERF=${PERF:-$(command -v perf)}
[ -n "$WRK" ] || { echo "profile_daemon.sh: wrk not found; install it: sudo apt-get install -y wrk" >&2; exit 2; }
[ -n "$PERF" ] || { echo "profile_daemon.sh: perf not found; install it: sudo apt-get install -y linux-perf" >&2; exit 2; }
[ -x "$gemmd" ] || make -s all >/dev/null || exit 1

. bench/loopback.sh # free_port, wait_up, float32_body
port=$(free_port)
start_gemmd "$out/gemmd.log" "$gemmd" "$port" "$threads" 1100
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
wait_up "http://127.0.0.1:$port" || { echo "gemmd did not start"; cat "$out/gemmd.log"; exit 1; }

body=$out/body-$n.bin
float32_body "$n" "$body"
url="http://127.0.0.1:$port/v1/matmul?m=$n&k=$n&n=$n&dtype=float32"

echo "# where gemmd's CPU goes: ${n}² raw float32, $threads HTTP threads, $(nproc) cores"
echo
echo "date: $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD 2>/dev/null); daemon $gemmd ($gemmd_conf)"
echo "command: SIZE=$n CONNS=\"$conns\" DURATION=$dur bench/profile_daemon.sh"
echo
python3 bench/thread_cpu.py --pid "$pid" --url "$url" --body "$body" --conns "$(echo "$conns" | tr ' ' ',')" \
    --duration 4 --wrk "$WRK"
for c in $conns; do
    t=$(( c < 8 ? c : 8 ))
    WRK_BODY=$body "$WRK" -t "$t" -c "$c" -d "$((dur + 2))s" -s bench/wrk_post.lua "$url" >"$out/wrk-$c.log" 2>&1 &
    w=$!
    sleep 1
    "$PERF" record -g -F 2999 -p "$pid" -o "$out/perf-$c.data" -- sleep "$dur" >"$out/perf-record-$c.log" 2>&1 ||
        { echo "perf record failed:"; cat "$out/perf-record-$c.log"; exit 1; }
    wait $w
    echo
    echo "## $c connections: $(awk '/Requests\/sec/ {print $2}' "$out/wrk-$c.log") requests/s"
    for kind in MHD-worker gemm-worker; do
        echo
        echo "### $kind: share of its samples, with what each calls"
        echo '```'
        "$PERF" report -i "$out/perf-$c.data" --children --comm "$kind" --sort dso,symbol -g none 2>/dev/null |
            grep -v '^#' | grep '%' | grep -v '\[unknown\]' | head -n "$top"
        echo '```'
    done
    echo
    echo "### MHD-worker: its top symbols and the call chains that reach them (1% and above)"
    echo '```'
    "$PERF" report -i "$out/perf-$c.data" --no-children --comm MHD-worker --sort symbol -g caller,1,callee,function \
        2>/dev/null | grep -v '^#' | grep -E '[a-z_]{4,}' | head -n "$((top * 3))"
    echo '```'
done
