#!/usr/bin/env bash
# bench/rounds.sh [OUTDIR] - gemmd builds and the bare libmicrohttpd server, in alternating
# rounds on one host, each started fresh for each round.
#
# One wrk run of one server says little on a shared host: the same binary moves by 10-20%
# from one run to the next, and more from one machine to another. This script runs every
# server of SERVERS once per round, the order reversed every other round, so that each
# comparison (a build against its base, gemmd against the ceiling) is made within one
# round, and prints one table row per server and round.
#
#   SERVERS   "name=path ..." (default "bare new=bin/gemmd"); the name bare is
#             build/bench/bare_mhd (bench/ceiling.sh's ceiling: the daemon's threading, same
#             bytes), any other a gemmd binary, started with its own tree's config
#             (DIR/config/gemmd.conf for DIR/bin/gemmd; else $GEMMD_CONF) and the flags of bench/ceiling.sh plus $GEMMD_FLAGS, plus $FLAGS_<name> for that
#             server alone (one binary can then run under two names: SERVERS="host=bin/gemmd
#             gpu=bin/gemmd" FLAGS_gpu=--host-max-mnk=0)
#   LOADS     "size@conns ..." (default "64@64 64@1 256@64"): raw float32 products of
#             size x size, wrk with conns connections (at most 8 threads)
#   ROUNDS    (default 3); DURATION (default 3) seconds a load after WARMUP (default 1)
#   BACKEND   (default auto), HTTP_THREADS (default: as bench/ceiling.sh)
#   SYSCALLS  1: after the rounds, each server once more at the first load while
#             `perf stat --per-thread` counts its system calls and context switches; prints
#             them per request by thread kind (needs perf and tracepoint access, so root
#             or kernel.perf_event_paranoid <= -1; skipped with a line saying so otherwise)
#
# Columns: requests/s, p50 and p99 in µs, answers with an error status (400 or above, as
# wrk counts them), the host's CPU busy share over the run (all cores: the servers and wrk
# together), and wrk's mean latency over the most its connections allow at its rate
# (bench/wrk_run.sh's wrk_little: about 1 or below when wrk's figures add up; well above 1,
# its latency figures in that run cannot be right). A benchmark: nothing is asserted. bench/results/h100-2026-11-27-share.md
# and -host.md were taken with it.
set -u
cd "$(dirname "$0")/.." || exit 1
out=${1:-bench/out/rounds}
mkdir -p "$out"
servers=${SERVERS:-bare new=bin/gemmd}
loads=${LOADS:-64@64 64@1 256@64}
rounds=${ROUNDS:-3}
dur=${DURATION:-3}
warm=${WARMUP:-1}
nproc=$(nproc)
threads=${HTTP_THREADS:-$(( nproc / 2 < 4 ? 4 : nproc / 2 > 16 ? 16 : nproc / 2 ))}
WRK=${WRK:-$(command -v wrk || { test -x /tmp/deps/usr/bin/wrk && echo /tmp/deps/usr/bin/wrk; })}
[ -n "$WRK" ] || { echo "rounds.sh: wrk not found; install it: sudo apt-get install -y wrk" >&2; exit 2; }
case " $servers " in *" bare "*) [ -x build/bench/bare_mhd ] || make -s bench >/dev/null || exit 1 ;; esac

. bench/loopback.sh # free_port, wait_up, float32_body
. bench/wrk_run.sh  # to_us, run_wrk, wrk_little
wrk_threads=8

maxc=0
for l in $loads; do c=${l#*@}; [ "$c" -gt "$maxc" ] && maxc=$c; done
limit=$((maxc + 64))
for l in $loads; do n=${l%@*}; [ -f "$out/body-$n.bin" ] || float32_body "$n" "$out/body-$n.bin"; done

pid=
port=
trap '[ -n "$pid" ] && { kill $pid 2>/dev/null; wait $pid 2>/dev/null; }' EXIT
start() { # NAME=PATH or bare
    local name=${1%%=*} path=${1#*=}
    port=$(free_port)
    if [ "$name" = bare ]; then
        start_bare "$out/server.log" "$port" "$threads" "$limit"
    else
        local own="FLAGS_$name" conf
        conf=$(dirname "$(dirname "$path")")/config/gemmd.conf # a build reads its own keys
        [ -f "$conf" ] || conf=${GEMMD_CONF:-config/gemmd.conf}
        # shellcheck disable=SC2086 # GEMMD_FLAGS and FLAGS_<name> are lists of flags
        GEMMD_CONF=$conf start_gemmd "$out/server.log" "$path" "$port" "$threads" "$limit" ${GEMMD_FLAGS:-} ${!own:-}
    fi
    pid=$!
    wait_up "http://127.0.0.1:$port" || { echo "$name did not start:"; cat "$out/server.log"; exit 1; }
}
stop() { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=; }
busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $5 + $6}' /proc/stat; }
url() { local n=${1%@*}; echo "http://127.0.0.1:$port/v1/matmul?m=$n&k=$n&n=$n&dtype=float32"; }

echo "# rounds: $servers"
echo
echo "host: $(hostname), $nproc cores, $(awk -F: '/model name/ {print $2; exit}' /proc/cpuinfo | sed 's/^ *//')"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD 2>/dev/null); wrk $("$WRK" -v 2>&1 | head -1 | awk '{print $2}')"
for s in $servers; do own="FLAGS_${s%%=*}"; [ -n "${!own:-}" ] && echo "$own=\"${!own}\""; done
echo "command: SERVERS=\"$servers\" LOADS=\"$loads\" ROUNDS=$rounds DURATION=$dur WARMUP=$warm HTTP_THREADS=$threads BACKEND=${BACKEND:-auto} GEMMD_FLAGS=\"${GEMMD_FLAGS:-}\" bench/rounds.sh"
echo
echo "| round | server | load | req/s | p50 µs | p99 µs | non-200 | host CPU busy | mean / bound |"
echo "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for r in $(seq "$rounds"); do
    order=$servers
    [ $((r % 2)) = 0 ] && order=$(echo "$servers" | tr ' ' '\n' | tac | tr '\n' ' ')
    for s in $order; do
        start "$s"
        for l in $loads; do
            n=${l%@*} c=${l#*@}
            if [ "$warm" -gt 0 ]; then
                WRK_BODY=$out/body-$n.bin "$WRK" -t "$((c < 8 ? c : 8))" -c "$c" -d "${warm}s" -s bench/wrk_post.lua \
                    "$(url "$l")" >"$out/warmup.log" 2>&1
            fi
            read -r b0 i0 < <(busy)
            read -r rps p50 p99 bad < <(run_wrk "$(url "$l")" "$out/body-$n.bin" "$c" "$out/wrk.log")
            read -r b1 i1 < <(busy)
            cpu=$(awk -v b=$((b1 - b0)) -v i=$((i1 - i0)) 'BEGIN { if (b + i > 0) printf "%.0f%%", 100 * b / (b + i); else print "-" }')
            little=$(wrk_little "$out/wrk.log" "$c")
            printf '| %s | %s | %s² @%s | %.0f | %.0f | %.0f | %s | %s | %s |\n' "$r" "${s%%=*}" "$n" "$c" "$rps" "$p50" "$p99" "$bad" "$cpu" "$little"
        done
        stop
    done
done

[ "${SYSCALLS:-0}" = 1 ] || exit 0
PERF=${PERF:-$(command -v perf)}
events=context-switches,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_epoll_wait
events=$events,syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendmsg
if [ -z "$PERF" ] || ! "$PERF" stat -e syscalls:sys_enter_futex -o /dev/null -- true >/dev/null 2>&1; then
    echo
    echo "SYSCALLS=1 skipped: perf or its syscall tracepoints are not available here (root, or kernel.perf_event_paranoid <= -1)"
    exit 0
fi
l=${loads%% *}
n=${l%@*} c=${l#*@}
echo
echo "## system calls and context switches per request, $n² at $c connections (a ${dur} s window)"
echo
echo "| server | thread kind | $(echo "$events" | tr ',' '\n' | sed 's/syscalls:sys_enter_//' | tr '\n' '|' | sed 's/|$//; s/|/ | /g') |"
echo "| --- | --- |$(echo "$events" | tr ',' '\n' | sed 's/.*/ ---: |/' | tr -d '\n')"
for s in $servers; do
    start "$s"
    WRK_BODY=$out/body-$n.bin "$WRK" -t "$((c < 8 ? c : 8))" -c "$c" -d "$((dur + 2))s" -s bench/wrk_post.lua "$(url "$l")" \
        >"$out/wrk-stat.log" 2>&1 &
    w=$!
    sleep 1
    "$PERF" stat -e "$events" --per-thread -x, -p "$pid" -o "$out/stat-${s%%=*}.csv" -- sleep "$dur" >/dev/null 2>&1
    wait $w
    rps=$(awk '/^Requests\/sec:/ {print $2}' "$out/wrk-stat.log")
    # rows: comm-tid,count,unit,event,...; per request = count / (req/s * window)
    awk -F, -v rps="${rps:-0}" -v dur="$dur" -v name="${s%%=*}" -v evs="$events" '
        BEGIN { ne = split(evs, ev, ",") }
        /^[^#]/ && NF > 3 && $2 ~ /^[0-9]+$/ { t = $1; sub(/-[0-9]+$/, "", t); kinds[t] = 1; sum[t, $4] += $2 }
        END {
            for (t in kinds) {
                line = sprintf("| %s | %s |", name, t); any = 0
                for (i = 1; i <= ne; i++) {
                    v = rps > 0 ? sum[t, ev[i]] / (rps * dur) : 0; if (v >= 0.005) any = 1
                    line = line sprintf(" %.2f |", v)
                }
                if (any) print line
            }
        }' "$out/stat-${s%%=*}.csv" | sort
    stop
done
