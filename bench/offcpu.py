#!/usr/bin/env python3
"""bench/offcpu.py PERF_SCRIPT_TEXT [MIN_MS] - how long the daemon's threads (HTTP, workers,
the CUDA event thread) and wrk's were off the CPU, and the stacks of the stretches of at
least MIN_MS (default 2) milliseconds, with the state they left in (S: asleep, R:
preempted) and the system call they slept in.

    perf record -e sched:sched_switch -g -p $(pidof gemmd) -o sched.data -- sleep 2
    perf script -i sched.data -F comm,tid,cpu,time,event,trace,ip,sym > sched.txt
    bench/offcpu.py sched.txt 2

(-a instead of -p takes wrk's threads too.) User frames need frame pointers to go deep;
the system call and the first frames are there either way. A diagnostic: nothing is
asserted. bench/results/h100-2026-11-27-host.md (section 7) used it."""
import collections
import re
import sys
HEADER = re.compile(r'^\s*(\S.*?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch:\s+(.*)$')
FIELD = re.compile(r'(\w+)=(\S+)')
KINDS = ('MHD', 'gemm-', 'cuda', 'wrk')  # thread names: HTTP threads, workers, CUDA's, wrk's


def events(path):
    """(time s, fields of the switch, stack: user frames and the system call) per switch."""
    ev = None
    for line in open(path, errors='replace'):
        m = HEADER.match(line)
        if m:
            if ev:
                yield ev
            ev = (float(m.group(4)), dict(FIELD.findall(m.group(5).replace(' ==> ', ' '))), [])
            continue
        parts = line.strip().split(None, 1)
        if not ev or len(parts) < 2:
            continue
        sym = re.sub(r'\+0x[0-9a-f]+', '', parts[1]).split(' (')[0]
        if parts[0].startswith('ffffffff'):  # kernel frames: keep only the system call
            if sym.startswith('__x64_sys_'):
                ev[2].append('sys:' + sym[len('__x64_sys_'):])
            continue
        ev[2].append(sym)
    if ev:
        yield ev


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    min_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    off = {}  # tid -> (time it left the CPU, thread name, state, stack)
    long_ones = collections.defaultdict(lambda: [0, 0.0, 0.0])  # count, sum ms, max ms
    stretches = collections.defaultdict(list)
    for t, f, stack in events(sys.argv[1]):
        prev, nxt = f.get('prev_pid'), f.get('next_pid')
        if f.get('prev_comm', '').startswith(KINDS):
            off[prev] = (t, f.get('prev_comm', ''), f.get('prev_state'), tuple(stack[:9]))
        if nxt in off:
            t0, comm, state, stk = off.pop(nxt)
            ms = (t - t0) * 1000
            kind = re.sub(r'[-\d]+$', '', comm)
            stretches[kind].append(ms)
            if ms >= min_ms:
                a = long_ones[(kind, state, stk)]
                a[0] += 1
                a[1] += ms
                a[2] = max(a[2], ms)
    for kind, ds in sorted(stretches.items()):
        ds.sort()
        n = len(ds)
        print("%s: %d off-CPU stretches, p50 %.3f ms, p99 %.3f ms, max %.3f ms, >= %g ms: %d" % (
            kind, n, ds[n // 2], ds[min(n - 1, int(n * 0.99))], ds[-1], min_ms, sum(1 for d in ds if d >= min_ms)))
    print()
    for (kind, state, stk), (c, total, mx) in sorted(long_ones.items(), key=lambda x: -x[1][1])[:25]:
        print("%s state=%s: %d times, %.1f ms in all, max %.1f ms" % (kind, state, c, total, mx))
        print("    " + " <- ".join(stk))


if __name__ == "__main__":
    main()
