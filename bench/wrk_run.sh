# bench/wrk_run.sh - sourced by bench/ceiling.sh, bench/batch_bench.sh and
# bench/fleet_nginx.sh: one wrk run of bench/wrk_post.lua and its figures. Needs WRK (the
# wrk binary), nproc (cores) and dur (seconds a run) set by the script that sources it;
# wrk_threads (wrk's threads, at most one a connection; unset: one a connection, at most
# nproc and 8) and wrk_timeout (wrk's --timeout; unset: wrk's own) if it wants them.

# wrk prints latency with units (us, ms, s): normalise to microseconds.
to_us() {
    awk -v v="$1" 'BEGIN { n = v + 0; u = v; sub(/^[0-9.]+/, "", u);
        if (u == "us") print n; else if (u == "ms") print n * 1000; else if (u == "s") print n * 1e6; else print n }'
}

run_wrk() { # URL BODY CONNS LOG -> "rps p50_us p99_us non200"
    local t=$3
    if [ -n "${wrk_threads:-}" ]; then
        [ "$wrk_threads" -lt "$t" ] && t=$wrk_threads
    else
        [ "$t" -gt "$nproc" ] && t=$nproc
        [ "$t" -gt 8 ] && t=8
    fi
    WRK_BODY=$2 "$WRK" -t "$t" -c "$3" -d "${dur}s" ${wrk_timeout:+--timeout "$wrk_timeout"} --latency \
        -s bench/wrk_post.lua "$1" >"$4" 2>&1
    local rps p50 p99 bad
    rps=$(awk '/^Requests\/sec:/ {print $2}' "$4")
    p50=$(to_us "$(awk '$1 == "50%" {print $2}' "$4")")
    p99=$(to_us "$(awk '$1 == "99%" {print $2}' "$4")")
    bad=$(awk '/^non200:/ {print $2}' "$4")
    echo "${rps:-0} ${p50:-0} ${p99:-0} ${bad:-?}"
}

# wrk_little LOG CONNS -> wrk's mean latency over the most a closed loop of CONNS
# connections allows at wrk's own rate (Little's law: mean <= CONNS / rate), as a ratio. Each
# connection has one request in flight, so the ratio is about 1 or below when wrk's figures
# add up (0.9-1.1 here: wrk's own rounding and start-up); well above 1 they cannot be right,
# and that run's percentiles should not be trusted.
wrk_little() {
    local rps mean
    rps=$(awk '/^Requests\/sec:/ {print $2}' "$1")
    mean=$(to_us "$(awk '$1 == "Latency" {print $2; exit}' "$1")")
    awk -v r="${rps:-0}" -v m="${mean:-0}" -v c="$2" 'BEGIN { if (r > 0 && c > 0) printf "%.2f", m * r / (c * 1e6); else print "-" }'
}
