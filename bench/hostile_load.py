#!/usr/bin/python3
"""hostile_load.py - the hostile battery against a real daemon on loopback, phase by phase,
with a well-behaved client and /healthz + /readyz probes running throughout.

    /usr/bin/python3 bench/hostile_load.py                      # bin/gemmd, print the table
    /usr/bin/python3 bench/hostile_load.py --bin /tmp/old-gemmd --label before --old
    /usr/bin/python3 bench/hostile_load.py --label after --out bench/results/hostile-load-cpu.md
    /usr/bin/python3 bench/hostile_load.py --fairness --no-tls --label after --out FILE.md

--old leaves out the configuration keys an older daemon does not know (those its --help
does not list). --out appends (or replaces) the section of that label in a Markdown file.
Each phase reports the daemon's largest RSS during it and --settle (10) s after it ended,
its peak RSS (VmHWM) so far, /healthz + /readyz latency (fresh connection each, every 50
ms), the well-behaved client's answers (checked against NumPy float64) and latency, and
what the attack got. Then: how fast each malformed request head is refused (framing), and,
on an HTTPS daemon of its own, /healthz latency under 1,000 TLS handshakes that never
finish (--no-tls leaves that out). --fairness adds the cases of tests/e2e/hostile_fair.py
(fairness() below lists them), each on a daemon of its own, with RSS and VmSize after each.
"""
import argparse
import datetime
import tempfile
import os
import platform
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

import harness  # noqa: E402
import hostile  # noqa: E402
import hostile_fair  # noqa: E402
import hostile_heads  # noqa: E402
from harness import Daemon, Tap, metric, parse_metrics  # noqa: E402
from hostile import percentile  # noqa: E402


# (name, what, constructor(port) -> Worker, seconds)
def phases(port, scale=1.0):
    ips = lambda a, b: ["127.0.0.%d" % i for i in range(a, b + 1)]  # noqa: E731
    t = lambda s: max(4.0, s * scale)  # noqa: E731
    return [
        ("slowloris", "5 addresses x 60 connections, one header byte a second",
         lambda: [hostile.slowloris(port, ips(2, 6), 60)], t(10)),
        ("idle flood", "1,000 connections from 10 addresses that send nothing",
         lambda: [hostile.SocketFlood("idle", port, ips(7, 16), 100, reopen=1.0)], t(10)),
        ("giant declared bodies", "100 connections declaring 256 MiB bodies (50 raw, 50 .npy), sending 20 bytes",
         lambda: [hostile.giant_declared(port, ips(30, 30), 50, 256, "raw"),
                  hostile.giant_declared(port, ips(31, 31), 50, 256, "npy")], t(8)),
        ("big JSON", "4 clients posting 32 MiB JSON products back to back",
         lambda: [hostile.BigJson(port, ips(40, 41), clients=4, mb=32)], t(10)),
        ("non-readers", "10 JSON + 40 raw answers of 1000x1000 float64 asked for and never read",
         lambda: [hostile.NonReader(port, ips(50, 50), count=10, n=1000, fmt="json"),
                  hostile.NonReader(port, ips(51, 51), count=40, n=1000, fmt="raw")], t(10)),
        ("framing", "malformed request heads (11 kinds) and 8 MiB bodies refused before they are read, sent "
         "without Expect",
         lambda: [hostile_heads.FramingFlood(port, ips(55, 56)), hostile_heads.EarlyRefusal(port, ips(57, 57))], t(6)),
        ("chunked stall", "120 chunked JSON uploads that send 1.5 MiB, then nothing, until the phase ends",
         lambda: [hostile.ChunkedStall(port, ips(60, 65), count=120, kb=1536)], t(8)),
        ("all at once", "every attack above together",
         lambda: [hostile.slowloris(port, ips(2, 6), 60),
                  hostile.SocketFlood("idle", port, ips(7, 16), 100, reopen=1.0),
                  hostile.giant_declared(port, ips(30, 30), 50, 256, "raw"),
                  hostile.BigJson(port, ips(40, 41), clients=2, mb=32),
                  hostile.NonReader(port, ips(50, 50), count=10, n=1000, fmt="json")], t(12)),
    ]


def attack_summary(w):
    st = ", ".join("%s: %d" % ("no answer" if k == 0 else k, v) for k, v in sorted(getattr(w, "statuses", {}).items()))
    if isinstance(w, hostile.SocketFlood):
        life = ("closed after p50 %.1f s" % percentile(w.lifetimes, 50)) if w.lifetimes else "none closed"
        return "%s: %d opened, %d closed by the daemon (%s; %s)" % (w.name, w.opened, w.closed_by_server,
                                                                    st or "-", life)
    if isinstance(w, hostile.BigJson):
        return "big JSON (%.0f MiB bodies): %s; %d wrong" % (len(w.body_bytes) / 2**20, st, w.wrong)
    if isinstance(w, hostile.NonReader):
        life = ("dropped after p50 %.1f s" % percentile(w.lifetimes, 50)) if w.lifetimes else "none dropped"
        return "non-readers (%s): %d asked, %d dropped by the daemon (%s), %d answered 503" % (
            w.fmt, w.sent, w.dropped, life, w.answered_503)
    if isinstance(w, hostile_heads.FramingFlood):
        secs = [x for v in w.seconds.values() for x in v]
        return "malformed heads: %d sent, %d not answered exactly once then closed %s; send to close p50 %.1f ms, " \
               "max %.1f ms" % (w.sent, len(w.wrong), w.wrong[:3] if w.wrong else "",
                                percentile(secs, 50) * 1e3, max(secs or [0]) * 1e3)
    if isinstance(w, hostile_heads.EarlyRefusal):
        return "bodies refused before read, sent without Expect: %d sent, %d got their 400%s" % (
            w.sent, w.answered, (" (first failures: %s)" % w.failures[:2]) if w.failures else "")
    if isinstance(w, hostile.ChunkedStall):
        return "chunked stall: %d uploads sent, at most %d held at once, %d dropped by the daemon" % (
            w.sent, w.held_peak, w.dropped)
    return w.name


def config(args, cfg):
    """cfg on --backend; with --old, less the keys the daemon's --help does not list."""
    cfg = dict(cfg, backend=args.backend)
    usage = subprocess.run([harness.GEMMD_BIN, "--help"], capture_output=True, text=True).stdout
    return {k: v for k, v in cfg.items() if not args.old or "--%s " % k.replace("_", "-") in usage}


def run(args):
    cfg = config(args, hostile.BATTERY_CONFIG)
    rows = []
    framing = None
    with Daemon(Tap(), config=cfg, check_exit=False) as d:
        pid = d.proc.pid
        base = hostile.proc_status(pid)
        mon = hostile.Monitor(pid)
        mon.start()
        good = hostile.GoodClient(d.port, "127.0.0.20")
        good.start()
        probe = hostile.Probe(d.port, "127.0.0.21")
        probe.start()
        time.sleep(2)
        rows.append(("idle", "no attack", probe.take(), good.take(), mon.take(), [], None))
        for name, what, make, secs in phases(d.port, args.scale):
            if args.phases and name not in args.phases.split(","):
                continue
            if not d.alive():
                rows.append((name, what, None, None, None, ["the daemon is gone"], None))
                break
            workers = make()
            for w in workers:
                w.start()
            time.sleep(secs)
            for w in workers:
                w.stop(wait=90)
            summ = [attack_summary(w) + ((" ERROR " + w.error.splitlines()[0]) if w.error else "")
                    for w in workers]
            if any(isinstance(w, hostile_heads.FramingFlood) for w in workers):
                framing = next(w for w in workers if isinstance(w, hostile_heads.FramingFlood))
            taken = (probe.take(), good.take(), mon.take())
            time.sleep(args.settle)  # then what the daemon gave back
            rows.append((name, what) + taken + (summ, hostile.proc_status(pid).get("VmRSS", 0) / 1024.0))
        probe.stop()
        good.stop()
        mon.stop()
        alive = d.alive()
        metrics = None
        if alive:
            r = d.curl("GET", "/metrics", max_time=10)
            metrics = r.body.decode("utf-8", "replace") if r.status == 200 else None
        d.stop()
    return rows, base, mon, alive, metrics, cfg, framing


def tls_run(args):
    """HTTPS /healthz on fresh connections (TLS handshake included), idle and under 1,000
    handshakes that never finish. Returns (idle latencies, flood latencies, failed probes,
    the flood worker, config) or None when no certificate can be made."""
    tmp = tempfile.TemporaryDirectory(prefix="gemmd-bench-tls-")
    cert, key = hostile.make_cert(tmp.name)
    if cert is None:
        return None
    cfg = config(args, dict(hostile.BATTERY_CONFIG, tls_cert=cert, tls_key=key))
    with Daemon(Tap(), config=cfg, wait=False, check_exit=False) as d:
        ctx = hostile.tls_client()
        for _ in range(300):
            st, _h, _b, sock = hostile.request(d.port, "127.0.0.21", "GET", "/healthz", tls=ctx)
            if sock:
                sock.close()
            if st == 200:
                break
            time.sleep(0.1)
        probe = hostile.Probe(d.port, "127.0.0.21", tls=True, paths=("/healthz",))
        probe.start()
        time.sleep(4)
        idle, _ = probe.take()
        flood = hostile.tls_pending(d.port, ["127.0.0.%d" % i for i in range(70, 80)], 100)
        flood.start()
        time.sleep(max(4.0, 10 * args.scale))
        flood.stop(wait=60)
        lat, _ = probe.take()
        probe.stop()
        failed = len(probe.bad_all)
        d.kill_if_running()
    tmp.cleanup()
    return idle, lat, failed, flood, cfg


def delay_hook(args):
    """The backend's hook that keeps each product running 3 s (the CUDA backend refuses the CPU's)."""
    return "cpu_delay_ms:3000" if args.backend == "cpu" else "gpu_delay_ms:3000"


def queued_jobs(args):
    """Finding 4: async jobs whose inputs are big and results small, against job_mem_mb 16.
    Returns (accepted, refused statuses, RSS MB with the jobs queued)."""
    cfg = config(args, {"log_level": "warn", "job_mem_mb": 16, "fault_inject": delay_hook(args), "queue_depth": 64,
                        "cpu_workers": 1, "threads": 1})
    import numpy as np
    a = np.ones((4096, 512), np.float32)   # 8 MiB
    b = np.ones((512, 16), np.float32)     # 32 KiB; C is 256 KiB
    body = a.tobytes() + b.tobytes()
    accepted, refused = 0, {}
    with Daemon(Tap(), config=cfg, check_exit=False) as d:
        for _ in range(32):
            r = d.curl("POST", "/v1/jobs?m=4096&k=512&n=16&dtype=float32", data=body,
                       content_type="application/octet-stream")
            if r.status == 202:
                accepted += 1
            else:
                key = "%d %s" % (r.status, r.error()[0])
                refused[key] = refused.get(key, 0) + 1
        rss = hostile.proc_status(d.proc.pid).get("VmRSS", 0) / 1024.0
        d.kill_if_running()
    return accepted, refused, rss


def fmt_ms(x):
    return "-" if x != x else "%.1f" % x


def framing_table(w):
    out = ["\nMalformed request heads, each on a fresh connection followed by a plain GET /healthz "
           "(`FramingFlood`, %d sent): answers seen, and the time from the send to the daemon's close.\n" % w.sent,
           "| head | answers (want) | send to close p50 / max ms |", "|---|---|---|"]
    wrong = {n: st for n, st, _c in w.wrong}
    for name, _data, want in w.cases:
        secs = w.seconds.get(name, [])
        got = ("%s" % wrong[name]) if name in wrong else "one" if secs else "-"
        out.append("| %s | %s (one %s) | %s / %s |" % (name, got, "/".join(map(str, want)),
                                                       fmt_ms(percentile(secs, 50) * 1e3),
                                                       fmt_ms(max(secs) * 1e3 if secs else float("nan"))))
    return "\n".join(out) + "\n\n"


def tls_table(res):
    idle, lat, failed, flood, cfg = res
    p = lambda xs, q: fmt_ms(percentile(xs, q) * 1e3)  # noqa: E731
    return ("HTTPS daemon of its own (the battery's limits: connection_limit %s, per_ip_limit %s), `/healthz` on "
            "a fresh TLS connection every 50 ms (handshake included):\n\n"
            "| | probes | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|\n"
            "| idle | %d | %s | %s | %s |\n"
            "| 1,000 handshakes that never finish (10 addresses x 100, reopened at once) | %d (%d failed) | %s | %s | "
            "%s |\n\nThe flood opened %d connections; the daemon closed %d.\n" % (
                cfg.get("connection_limit"), cfg.get("per_ip_limit"), len(idle), p(idle, 50), p(idle, 99),
                fmt_ms(max(idle or [float("nan")]) * 1e3), len(lat), failed, p(lat, 50), p(lat, 99),
                fmt_ms(max(lat or [float("nan")]) * 1e3), flood.opened, flood.closed_by_server))


def table(rows, base, mon, alive, cfg, settle, metrics=None):
    out = ["Daemon config: `%s`  " % ", ".join("%s=%s" % kv for kv in sorted(cfg.items()))]
    out.append("Start RSS %.0f MB (anonymous %.0f, file-backed %.0f); peak RSS (VmHWM) over the run **%.0f MB**; "
               "at most %d fds open; daemon alive at the end: %s.\n" % (
                   base.get("VmRSS", 0) / 1024, base.get("RssAnon", 0) / 1024, base.get("RssFile", 0) / 1024,
                   mon.hwm_kb / 1024, mon.max_fds, "yes" if alive else "**no**"))
    parts = mon.parts_at_max
    if parts:
        out.append("At the largest RSS: anonymous %.0f MB, file-backed %.0f MB, shared %.0f MB." % (
                       parts.get("RssAnon", 0) / 1024, parts.get("RssFile", 0) / 1024,
                       parts.get("RssShmem", 0) / 1024))
    if metrics:
        peak = metric(parse_metrics(metrics), "gemmd_memory_inflight_peak_bytes")
        out.append("Most bytes charged against the budget at once: %.0f MB (gemmd_memory_inflight_peak_bytes).\n"
                   % (peak / 1e6))
    out.append("| phase | attack | max RSS MB | RSS %g s after MB | VmHWM MB | health p50 / p99 / max ms (n, failed) "
               "| good client ok / wrong / 503 / failed | good p50 / p99 / max ms |" % settle)
    out.append("|---|---|---|---|---|---|---|---|")
    for name, what, pr, gd, mo, _s, after in rows:
        if pr is None:
            out.append("| %s | %s | - | - | - | - | - | - |" % (name, what))
            continue
        lat, bad = pr
        out.append("| %s | %s | %.0f | %s | %.0f | %s / %s / %s (%d, %d) | %d / %d / %d / %d | %s / %s / %s |" % (
            name, what, mo[0] / 1024, "-" if after is None else "%.0f" % after, mo[1] / 1024,
            fmt_ms(percentile(lat, 50) * 1e3),
            fmt_ms(percentile(lat, 99) * 1e3), fmt_ms(max(lat) * 1e3 if lat else float("nan")), len(lat), bad,
            gd["ok"], gd["wrong"], gd["refused"], gd["failed"], fmt_ms(gd["p50_ms"]), fmt_ms(gd["p99_ms"]),
            fmt_ms(gd["max_ms"])))
    out.append("")
    out.append("What each attack got:\n")
    for name, _w, _p, _g, _m, summ, _a in rows:
        for s in summ:
            out.append("- %s — %s" % (name, s))
    out.append("")
    return "\n".join(out)


def admission_rows(r):
    sec = r["seconds"]
    return [("%.1f MiB bodies: answered right / wrong / not" % r["mb"], "%d / %d / %s" % (
                r["right"], r["wrong"], r["failed"] or 0)),
            ("right at the first try (tries in all)", "%d (%d)" % (r["first_try"], r["tries"])),
            ("refused (503) once the body had begun to go", r["after_body"]),
            ("largest Retry-After", "%g s" % r["retry_after"] if r["retry_after"] else "none sent"),
            ("seconds to the answer: p50 / max", "%.1f / %.1f" % (sec[len(sec) // 2], sec[-1]))]


def abandoned_rows(d):
    r = hostile_fair.abandoned(d)
    f = lambda x: "not within 240 s" if x is None else "%.1f s" % x  # noqa: E731
    return [("products on the engine 0.3 s in (queued + running)", "%d" % r["busy"]),
            ("engine idle (queue and running 0) after the close", f(r["idle_after"])),
            ("daemon CPU from the close to idle; over the 10 s after the close",
             "%s; %s" % (f(r["cpu_to_idle"]), f(r["cpu_10s"]))),
            ("gemmd_clients_left_total", "-" if r["left"] is None else "%d" % r["left"]),
            ("a good client's 64^2 product sent at the close", "%s in %s, %s" % (
                r["good_status"], f(r["good_seconds"]), "right" if r["good_right"] else "**not right**"))]


def quota_rows(d, toks):
    r = hostile_fair.quotas(d, toks)
    return [("A: " + w, "%s taken; the next: %s" % (n, nxt)) for w, n, nxt in r["A"]] + [
        ("B: " + w, "%s in %.0f ms%s" % (st, sec * 1e3, {None: "", True: ", right", False: ", **wrong**"}[ok]))
        for w, st, sec, ok in r["B"]]


def declared_rows(d):
    r = hostile_fair.declared(d)
    return [("VmSize / VmRSS MB idle", "%.0f / %.0f" % (r["vm_before"], r["rss_before"])),
            ("VmSize / VmRSS MB, largest during", "%.0f / %.0f" % (r["vm_max"], r["rss_max"])),
            ("what the connections got", "; ".join(attack_summary(w) for w in r["floods"]))]


def fairness(args):
    """The cases of hostile_fair, each on a daemon of its own: a Markdown table."""
    tmp = tempfile.TemporaryDirectory(prefix="gemmd-bench-fair-")
    toks, tokfile = ("tokenAAAAsecret", "tokenBBBBsecret"), os.path.join(tmp.name, "tokens")
    with open(tokfile, "w") as f:  # "name token" lines; an older daemon reads a token a line
        f.write("".join(("" if args.old else n + " ") + t + "\n" for n, t in zip(("alice", "bob"), toks)))
    adm = {"max_inflight_mb": 512}
    quota = dict(adm, tokens_file=tokfile, token_share=50, resident_mb=256, max_jobs=16, job_mem_mb=64)
    cases = [("16 x 64 MiB raw uploads at once, each from its own address", adm,
              lambda d: admission_rows(hostile_fair.admission(d, 16, 64, sources=16))),
             ("16 x 64 MiB raw uploads at once, all from one address", adm,
              lambda d: admission_rows(hostile_fair.admission(d, 16, 64, sources=1))),
             ("4 x 60 MiB JSON products at once", adm,
              lambda d: admission_rows(hostile_fair.admission(d, 4, 60, "json", sources=4))),
             ("4 x 60 MiB JSON products at once, sent without Expect", adm,
              lambda d: admission_rows(hostile_fair.admission(d, 4, 60, "json", sources=4, expect=False))),
             ("32 products of 4096^3 float32 on resident A and B, clients gone after 0.3 s",
              {"max_inflight_mb": 8192, "queue_depth": 64}, abandoned_rows),
             ("token A at its share of all that is kept; token B meanwhile", quota, lambda d: quota_rows(d, toks)),
             ("200 connections declaring 2 GiB bodies (100 raw, 100 .npy forms), 20 bytes sent, 10 s",
              {"max_inflight_mb": 4096}, declared_rows)]
    keys = ("max_inflight_mb", "queue_depth", "token_share", "resident_mb", "max_jobs", "job_mem_mb")
    out = ["Fairness between well-formed clients (tests/e2e/hostile_fair.py), each case on a daemon of its own "
           "(`log_level=warn`, the config named, defaults otherwise); RSS and VmSize %g s after each case.\n" %
           args.settle, "| case | measure | figure |", "|---|---|---|"]
    for name, cfg, fn in cases:
        cfg = config(args, dict(cfg, log_level="warn"))
        with Daemon(Tap(), config=cfg, check_exit=False) as d:
            idle = hostile.proc_status(d.proc.pid)
            rows = fn(d)
            time.sleep(args.settle)
            st = [(x.get("VmRSS", 0) / 1024, x.get("VmSize", 0) / 1024)
                  for x in (idle, hostile.proc_status(d.proc.pid))]
            d.kill_if_running()
        rows.append(("RSS / VmSize MB: idle, %g s after" % args.settle, "%.0f / %.0f, %.0f / %.0f" % (st[0] + st[1])))
        name += " (`%s`)" % ", ".join("%s=%s" % kv for kv in sorted(cfg.items()) if kv[0] in keys)
        out += ["| %s | %s | %s |" % (name if i == 0 else "", m, v) for i, (m, v) in enumerate(rows)]
    tmp.cleanup()
    return "\n".join(out) + "\n\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", help="daemon binary (default bin/gemmd or $GEMMD_BIN)")
    ap.add_argument("--old", action="store_true", help="leave out configuration keys the daemon does not know")
    ap.add_argument("--label", default="run")
    ap.add_argument("--backend", default="cpu", choices=("cpu", "cuda"), help="cpu or cuda (default cpu)")
    ap.add_argument("--out", help="Markdown file to add this run's section to")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply phase durations")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after a phase or case: then RSS is read")
    ap.add_argument("--phases", help="comma-separated phase names to run (default: all; none: only the idle row)")
    ap.add_argument("--no-tls", action="store_true", help="leave out the HTTPS daemon and its handshake flood")
    ap.add_argument("--fairness", action="store_true", help="add the fairness cases (tests/e2e/hostile_fair.py)")
    args = ap.parse_args()
    if args.bin:
        os.environ["GEMMD_BIN"] = harness.GEMMD_BIN = os.path.abspath(args.bin)
    load = "%.1f %.1f %.1f" % os.getloadavg()
    rows, base, mon, alive, metrics, cfg, framing = run(args)
    text = table(rows, base, mon, alive, cfg, args.settle, metrics)
    if framing:
        text += framing_table(framing)
    if not args.no_tls:
        res = tls_run(args)
        text += tls_table(res) + "\n" if res else "HTTPS: no certificate could be made (openssl).\n\n"
    acc, ref, rss = queued_jobs(args)
    text += ("Queued async jobs (finding 4), own daemon with `job_mem_mb = 16`, `" + delay_hook(args) + "`: 32 submits "
             "of jobs with 8 MiB of inputs and a 256 KiB result: **%d accepted**, refused %s; daemon RSS with them "
             "queued **%.0f MB**.\n\n" % (acc, ref or "none", rss))
    text += fairness(args) if args.fairness else ""
    text = ("### %s\n\nCommand: `/usr/bin/python3 bench/hostile_load.py %s`  \nLoad average (1, 5, 15 min) at the "
            "start %s, at the end %.1f %.1f %.1f.  \n%s" % (args.label, shlex.join(sys.argv[1:]), load,
                                                            *os.getloadavg(), text))
    print(text)
    if metrics:
        keep = [ln for ln in metrics.splitlines() if ln.startswith(("gemmd_memory", "gemmd_connections"))]
        if keep:
            print("metrics at the end:\n" + "\n".join(keep))
    if args.out:
        header = ("# Hostile load on the %s backend\n\nHost: %s, %d cores, %s. Loopback only.\n\n"
                  % (args.backend.upper(), platform.node() or "dev", os.cpu_count() or 0, platform.platform()))
        old = open(args.out).read() if os.path.exists(args.out) else header
        start = old.find("### %s\n" % args.label)
        section = "%s_Run %s._\n\n" % (text, datetime.date.today().isoformat())
        if start >= 0:
            end = old.find("\n### ", start + 1)
            old = old[:start] + section + (old[end + 1:] if end >= 0 else "")
        else:
            old = old.rstrip("\n") + "\n\n" + section
        with open(args.out, "w") as f:
            f.write(old)


if __name__ == "__main__":
    main()
