#!/usr/bin/python3
"""test_fleet.py - what a fleet of daemons needs from each one: its name (instance_id) in
every answer and in every job id, and the load gauges of /metrics that balancers and
autoscalers read (requests in flight, queue capacity, workers, device utilisation).
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (GEMMD_BIN, SLOW, Daemon, Tap, free_port, metric, random_matrix,  # noqa: E402
                     run_guarded)

HEX32 = r"[0-9a-f]{32}"


def submit(d, headers=None):
    return d.curl("POST", "/v1/jobs", data=b'{"a":[[1,2],[3,4]],"b":[[5],[6]]}', content_type="application/json",
                  headers=headers)


def names(tap):
    # Set in the file, the environment and a flag: the flag wins, as for every key.
    with Daemon(tap, config={"instance_id": "from-file"}) as d:
        r = d.curl("GET", "/v1/info")
        tap.ok((r.json() or {}).get("instance_id") == "from-file" and r.header("x-gemm-instance") == "from-file",
               "instance_id from the config file: /v1/info and X-Gemm-Instance name it", r)
        r = submit(d)
        jid = (r.json() or {}).get("id", "")
        tap.ok(r.status == 202 and re.fullmatch("from-file-" + HEX32, jid) and
               r.header("location") == "/v1/jobs/" + jid, "job ids are <instance_id>-<32 hex digits>", r)
        ids = {jid}
        for _ in range(5):
            ids.add((submit(d).json() or {}).get("id"))
        tap.ok(len(ids) == 6, "six jobs, six different ids", ids)
        r = d.curl("GET", "/v1/jobs/%s/result" % jid, accept="application/json")
        for _ in range(100):
            if r.status != 409:
                break
            time.sleep(0.05)
            r = d.curl("GET", "/v1/jobs/%s/result" % jid, accept="application/json")
        tap.ok(r.status == 200 and (r.json() or {}).get("c") == [[17], [39]], "the job is fetched by its id", r)
        # Ids of the same shape but another instance, or of no shape: 404, the daemon serves on.
        for path in ("/v1/jobs/other-node-" + "0" * 32, "/v1/jobs/" + "0" * 32, "/v1/jobs/from-file-" + "0" * 31,
                     "/v1/jobs/-" + "0" * 32, "/v1/jobs/from%2ffile-" + "0" * 32, "/v1/jobs/" + "a" * 70 + "-" + "0" * 32):
            r = d.curl("GET", path)
            tap.ok(r.status == 404 and r.error()[0] in ("job_not_found", "not_found"),  # %2f: another route
                   "GET %s...: 404 with a JSON error" % path[:40], r)
    with Daemon(tap, config={"instance_id": "from-file"}, env={"GEMMD_INSTANCE_ID": "from-env"}) as d:
        tap.eq(d.curl("GET", "/v1/info").header("x-gemm-instance"), "from-env", "GEMMD_INSTANCE_ID outranks the file")
    with Daemon(tap, env={"GEMMD_INSTANCE_ID": "from-env"}, flags=["--instance-id", "from-flag"]) as d:
        tap.eq(d.curl("GET", "/v1/info").header("x-gemm-instance"), "from-flag", "--instance-id outranks the variable")

    # Unset: the short host name and the port; the same in every place that shows it.
    with Daemon(tap) as d:
        r = d.curl("GET", "/v1/info")
        inst = (r.json() or {}).get("instance_id", "")
        jid = (submit(d).json() or {}).get("id", "")
        tap.ok(re.fullmatch(r"[a-z0-9]([a-z0-9._-]*[a-z0-9])?-%d" % d.port, inst) and
               r.header("x-gemm-instance") == inst and jid == inst + jid[len(inst):] and
               re.fullmatch("-" + HEX32, jid[len(inst):]),
               "without instance_id: <short host name>-<port> (%s), in the header and the ids" % inst, (inst, jid))
        tap.ok("instance=" + inst in d.read_log(), "the start-up line names the instance", d.read_log()[-600:])

    # Bad names stop the daemon with exit 2, naming where the value came from.
    for how, extra_env, flags, needle in (
            ("the file", {}, [], "gemmd.conf:"),
            ("GEMMD_INSTANCE_ID", {"GEMMD_INSTANCE_ID": "a/b"}, [], "GEMMD_INSTANCE_ID"),
            ("--instance-id", {}, ["--instance-id", "-x"], "--instance-id"),
            ("--instance-id", {}, ["--instance-id", "x" * 63], "at most 62")):
        with tempfile.TemporaryDirectory(prefix="gemmd-fleet-") as tmp:
            conf = os.path.join(tmp, "gemmd.conf")
            with open(conf, "w") as f:
                f.write("backend = cpu\n" + ("instance_id = has space\n" if how == "the file" else ""))
            env = {k: v for k, v in os.environ.items() if not k.startswith("GEMMD_")}
            env.update(extra_env)
            p = subprocess.run([GEMMD_BIN, "--config", conf, "--port", str(free_port())] + flags, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30 * SLOW)
            out = p.stdout.decode("utf-8", "replace")
            tap.ok(p.returncode == 2 and "instance_id" in out and needle in out,
                   "a bad instance_id in %s: exit 2, the message names it (%s)" % (how, needle), (p.returncode, out))


def header_everywhere(tap):
    with tempfile.TemporaryDirectory(prefix="gemmd-fleet-") as tmp:
        tok = os.path.join(tmp, "tokens")
        with open(tok, "w") as f:
            f.write("fleet-token\n")
        with Daemon(tap, config={"instance_id": "node-7", "tokens_file": tok}) as d:
            auth = ["Authorization: Bearer fleet-token"]
            cases = [("GET", "/healthz", None, None), ("GET", "/readyz", None, None),
                     ("GET", "/v1/info", auth, None), ("GET", "/metrics", auth, None),
                     ("GET", "/v1/info", None, None),  # 401
                     ("GET", "/nowhere", auth, None), ("PUT", "/v1/matmul", auth, None),
                     ("POST", "/v1/matmul", auth, b'{"a":[[1,2]],"b":[[1,2]]}'),  # 422 shapes
                     ("POST", "/v1/matmul", auth, b'{"a":'),  # 400
                     ("POST", "/v1/matmul", auth, b'{"a":[[1,2]],"b":[[1],[2]]}'),
                     ("POST", "/v1/jobs", auth, b'{"a":[[1]],"b":[[2]]}'),
                     ("GET", "/v1/jobs/node-7-" + "0" * 32, auth, None)]
            missing = []
            statuses = []
            for method, path, hdr, body in cases:
                r = d.curl(method, path, headers=hdr, data=body,
                           content_type="application/json" if body else None)
                statuses.append(r.status)
                if r.header("x-gemm-instance") != "node-7":
                    missing.append((method, path, r))
            tap.ok(not missing and {200, 202, 400, 401, 404, 405, 422} <= set(statuses),
                   "every answer carries X-Gemm-Instance: node-7 (200, 202, 400, 401, 404, 405, 422 alike)",
                   (statuses, missing))


def gauges(tap):
    with Daemon(tap, config={"instance_id": "gauge-1", "queue_depth": "5", "cpu_workers": "2", "threads": "1",
                             "fault_inject": "cpu_delay_ms:1500"}) as d:
        r, m = d.metrics()
        tap.ok(m is not None and metric(m, "gemmd_instance_info", instance_id="gauge-1") == 1 and
               metric(m, "gemmd_queue_capacity") == 5 and metric(m, "gemmd_workers") == 2 and
               ("gemmd_requests_in_flight", frozenset()) in m and
               metric(m, "gemmd_requests_in_flight") == 0,
               "/metrics: gemmd_instance_info, gemmd_queue_capacity 5, gemmd_workers 2, nothing in flight", r)
        text = r.body.decode()
        tap.ok(all("# TYPE %s gauge" % n in text for n in ("gemmd_instance_info", "gemmd_requests_in_flight",
                                                           "gemmd_queue_capacity", "gemmd_workers",
                                                           "gemmd_device_utilization")),
               "the new series are typed gauges")
        # Three products that each wait 1.5 s: two on the workers, one in the queue.
        done = []
        threads = [threading.Thread(target=lambda: done.append(d.matmul_json([[1.0]], [[2.0]]))) for _ in range(3)]
        for t in threads:
            t.start()
        seen = (0, 0, 0)
        deadline = time.monotonic() + 20 * SLOW
        while time.monotonic() < deadline:
            _, m = d.metrics()
            if m:
                seen = (metric(m, "gemmd_requests_in_flight"), metric(m, "gemmd_jobs_running"),
                        metric(m, "gemmd_queue_depth"))
                if seen == (3, 2, 1):
                    break
            time.sleep(0.02)
        for t in threads:
            t.join(timeout=60 * SLOW)
        tap.ok(seen == (3, 2, 1), "three slow products: 3 requests in flight (the scrape left out), 2 running, "
               "1 queued", seen)
        _, m = d.metrics()
        tap.ok(len(done) == 3 and all(x.status == 200 for x in done) and m is not None and
               metric(m, "gemmd_requests_in_flight") == 0, "once they are answered, nothing is in flight", done)


def utilisation(tap):
    t_launch = time.monotonic()
    with Daemon(tap, config={"threads": "1"}) as d:
        t_up = time.monotonic()
        _, m = d.metrics()
        tap.ok(m is not None and ("gemmd_device_utilization", frozenset({("device", "0")})) in m and
               metric(m, "gemmd_device_utilization", device="0") == 0,
               "device 0's utilisation is 0 before any product", m and {k: v for k, v in m.items()
                                                                         if k[0] == "gemmd_device_utilization"})
        rng = np.random.default_rng(4)
        a, b = random_matrix(rng, (320, 320), "float64"), random_matrix(rng, (320, 320), "float64")
        for _ in range(6):
            r = d.matmul_raw(a, b, "float64")
            if r.status != 200:
                break
        t0 = time.monotonic()
        r, m = d.metrics()
        t1 = time.monotonic()
        busy = metric(m, "gemmd_device_busy_seconds_total", device="0") if m else 0
        util = metric(m, "gemmd_device_utilization", device="0") if m else -1
        # Within the first minute the window starts when the engine started (after the
        # launch, before the daemon answered): so busy / util lies between the two.
        lo, hi = busy / (t1 - t_launch), busy / max(t0 - t_up, 1e-6)
        tap.ok(busy > 0 and 0 < util <= 1 and lo - 1e-4 <= util <= min(1.0, hi) + 1e-4,
               "after six products the utilisation is busy seconds / seconds since start (%.4f <= %.4f <= %.4f)"
               % (lo, util, min(1.0, hi)), (busy, util, t0 - t_up, t1 - t_launch))


def main(tap):
    names(tap)
    header_everywhere(tap)
    gauges(tap)
    utilisation(tap)


if __name__ == "__main__":
    run_guarded(Tap(), main)
