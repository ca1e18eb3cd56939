#!/usr/bin/python3
"""test_status.py - the status page and its figures, on a live CPU daemon with named tokens.

- GET / is open, text/html, self-contained (no http(s):// URL, no src or href that loads
  anything, a Content-Security-Policy that allows nothing from elsewhere) and asks for
  v1/status by a relative URL;
- GET /v1/status needs a token like the other routes and has the documented fields
  (docs/API.md; every field and no other as docs/openapi.yaml's Status schema says), which
  move with load: products/s > 0 after products, a token's counters
  move for that token only (sync products, async jobs), an error shows among the recent
  errors with its route, status, code and token name;
- /metrics has the gemmd_token_* families with the same counts;
- no token's secret ever appears in /v1/status, /metrics, the page or the log;
- without tokens_file every request is the one user "anonymous", and /v1/status is open.
"""
import json
import os
import re
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import REPO, Daemon, Tap, metric, parse_metrics, run_guarded  # noqa: E402

ALICE = "sEcReT-alice-" + os.urandom(8).hex()
TWO = "sEcReT-two-" + os.urandom(8).hex()
USE_FIELDS = {"requests", "errors", "products", "compute_s", "bytes_in", "bytes_out"}


def bearer(tok):
    return ["Authorization: Bearer " + tok]


def status(d, tok=None):
    r = d.curl("GET", "/v1/status", headers=bearer(tok) if tok else None)
    return r, (r.json() or {}) if r.status == 200 else {}


def token_use(s, name):
    for t in s.get("tokens", []):
        if t.get("name") == name:
            return t
    return {"window": dict.fromkeys(USE_FIELDS, 0), "total": dict.fromkeys(USE_FIELDS, 0)}


def page(tap, d):
    r = d.curl("GET", "/")
    html = r.body.decode("utf-8", "replace")
    tap.ok(r.status == 200 and (r.header("content-type") or "").startswith("text/html"),
           "GET / without a token: 200 text/html", r)
    tap.ok("<script>" in html and "<style>" in html and re.search(r"fetch\(\"v1/status\"", html),
           "the page has its script and style inline and asks for v1/status by a relative URL", html[:300])
    urls = re.findall(r"https?://", html)
    loads = [m for m in re.findall(r"""\b(?:src|href)\s*=\s*["']?([^"'\s>]*)""", html, re.I)
             if not m.startswith(("data:", "#"))]
    tap.ok(not urls and not loads and "@import" not in html and "url(" not in html,
           "the page is self-contained: no http(s):// URL, no src/href that loads anything", (urls, loads))
    csp = r.header("content-security-policy") or ""
    tap.ok("default-src 'none'" in csp and "connect-src 'self'" in csp,
           "Content-Security-Policy: nothing from elsewhere, fetches to this origin only", csp)
    return html


def fields(tap, s):
    top = {"version", "instance_id", "backend", "uptime_s", "time", "busy_window_s", "devices", "queue",
           "memory", "rates", "latency", "tokens", "errors"}
    tap.ok(top <= set(s), "/v1/status has %s" % ", ".join(sorted(top)), sorted(set(s)))
    devs = s.get("devices") or [{}]
    dev_fields = {"index", "name", "busy", "running", "streams", "mem_total", "mem_used", "mem_free"}
    tap.ok(devs and all(dev_fields <= set(x) and 0 <= x["busy"] <= 1 for x in devs),
           "each device: index, name, busy (0..1), running, streams, mem_total, mem_used, mem_free", devs)
    q = s.get("queue", {})
    tap.ok({"queued", "running", "capacity", "workers", "wait_estimate_s"} <= set(q) and q["capacity"] > 0,
           "queue: queued, running, capacity, workers, wait_estimate_s", q)
    r = s.get("rates", {})
    tap.ok({"step_s", "products_per_s", "requests_per_s", "errors_per_s"} <= set(r) and
           all(len(r.get(k, [])) == 30 for k in ("products", "requests", "errors")),
           "rates: per second over the last minute, and 30 steps of products, requests, errors", r)
    lat = s.get("latency", {})
    tap.ok({"window_s", "jobs", "mean_ms", "p50_ms", "p95_ms", "queue_p50_ms", "queue_p95_ms"} <= set(lat),
           "latency: window_s, jobs, mean_ms, p50_ms, p95_ms, queue_p50_ms, queue_p95_ms", lat)
    toks = s.get("tokens", [])
    tap.ok(all({"name", "window", "total"} <= set(t) and USE_FIELDS <= set(t["window"]) and
               USE_FIELDS <= set(t["total"]) for t in toks),
           "tokens: name, window and total of requests, errors, products, compute_s, bytes_in, bytes_out", toks)
    m = s.get("memory", {})
    tap.ok({"budget_bytes", "inflight_bytes"} <= set(m) and m["budget_bytes"] > 0, "memory: budget and in flight", m)


def documented(schema, value, root, where="status"):
    """Where value strays from its schema in docs/openapi.yaml: a required field missing, a
    field the schema does not list, a wrong JSON type (objects and arrays followed down)."""
    if "$ref" in schema:
        schema = root["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float)}
    if value is None:
        return [] if schema.get("nullable") else ["%s is null" % where]
    if kind in types and (not isinstance(value, types[kind]) or isinstance(value, bool)):
        return ["%s is not %s: %r" % (where, kind, value)]
    out = []
    if kind == "object" and "properties" in schema:
        props = schema["properties"]
        out += ["%s.%s missing" % (where, k) for k in schema.get("required", []) if k not in value]
        out += ["%s.%s undocumented" % (where, k) for k in value if k not in props]
        for k, v in value.items():
            if k in props:
                out += documented(props[k], v, root, where + "." + k)
    if kind == "array" and "items" in schema:
        for i, v in enumerate(value):
            out += documented(schema["items"], v, root, "%s[%d]" % (where, i))
    return out


def openapi_checks(tap, s):
    try:
        import yaml
    except ImportError:
        tap.skip("/v1/status as docs/openapi.yaml says", "no PyYAML for /usr/bin/python3; install it: "
                 "sudo apt-get install -y python3-yaml")
        return
    with open(os.path.join(REPO, "docs", "openapi.yaml")) as f:
        api = yaml.safe_load(f)
    tap.ok("/" in api["paths"] and "/v1/status" in api["paths"], "openapi.yaml has / and /v1/status")
    bad = documented(api["components"]["schemas"]["Status"], s, api)
    tap.ok(not bad, "/v1/status is as docs/openapi.yaml's Status schema says (every field, no other)", bad)


def with_tokens(tap):
    tmp = tempfile.mkdtemp(prefix="gemmd-e2e-status-")
    tokens = os.path.join(tmp, "tokens")
    with open(tokens, "w") as f:
        f.write("# named and unnamed\nalice %s\n%s\n" % (ALICE, TWO))
    with Daemon(tap, config={"backend": "cpu", "tokens_file": tokens, "log_level": "debug"}) as d:
        html = page(tap, d)
        r, _ = status(d)
        tap.ok(r.status == 401 and r.error()[0] == "unauthorized", "/v1/status without a token: 401", r)
        r, s0 = status(d, ALICE)
        tap.ok(r.status == 200 and r.header("content-type") == "application/json", "/v1/status with a token: 200 JSON", r)
        fields(tap, s0)

        rng = np.random.default_rng(7)
        for _ in range(5):
            a, b = rng.uniform(-1, 1, (9, 7)), rng.uniform(-1, 1, (7, 5))
            r = d.curl("POST", "/v1/matmul", data=json.dumps({"a": a.tolist(), "b": b.tolist()}).encode(),
                       content_type="application/json", headers=bearer(ALICE))
            tap.ok(r.status == 200, "alice's product", r)
        r = d.curl("POST", "/v1/jobs", data=json.dumps({"a": [[1, 2]], "b": [[3], [4]]}).encode(),
                   content_type="application/json", headers=bearer(TWO))
        jid = (r.json() or {}).get("id", "")
        tap.ok(r.status == 202 and jid, "token2's async job is accepted", r)
        for _ in range(200):
            j = d.curl("GET", "/v1/jobs/" + jid, headers=bearer(TWO)).json() or {}
            if j.get("state") in ("done", "failed", "cancelled"):
                break
            time.sleep(0.02)
        r = d.curl("POST", "/v1/matmul", data=b'{"a": [[1, 2]], "b": [[1, 2]]}', content_type="application/json",
                   headers=bearer(TWO))
        tap.ok(r.status == 422 and r.error()[0] == "shape_mismatch", "token2's bad product: 422 shape_mismatch", r)
        d.curl("GET", "/v1/info", headers=bearer("not-a-token"))

        r, s1 = status(d, ALICE)
        openapi_checks(tap, s1)
        a0, a1 = token_use(s0, "alice"), token_use(s1, "alice")
        t0, t1 = token_use(s0, "token2"), token_use(s1, "token2")
        tap.ok(s1["rates"]["products_per_s"] > 0 and sum(s1["rates"]["products"]) >= 6 and
               s1["latency"]["jobs"] >= 6 and s1["latency"]["p95_ms"] >= s1["latency"]["p50_ms"] > 0,
               "after 6 products: products/s > 0, the steps count them, latency has them",
               (s1["rates"], s1["latency"]))
        tap.ok(a1["total"]["products"] - a0["total"]["products"] == 5 and
               a1["window"]["products"] - a0["window"]["products"] == 5 and
               a1["total"]["compute_s"] > a0["total"]["compute_s"] and
               a1["total"]["bytes_in"] > a0["total"]["bytes_in"] and a1["total"]["errors"] == a0["total"]["errors"],
               "alice's counters moved by her 5 products, and she has no error", (a0, a1))
        tap.ok(t1["total"]["products"] - t0["total"]["products"] == 1 and
               t1["total"]["errors"] - t0["total"]["errors"] == 1 and
               t1["total"]["requests"] - t0["total"]["requests"] >= 3,
               "token2's counters moved by its job (1 product) and its error (1)", (t0, t1))
        errs = s1.get("errors", [])
        e422 = [e for e in errs if e.get("code") == "shape_mismatch"]
        tap.ok(e422 and e422[0]["status"] == 422 and e422[0]["route"] == "/v1/matmul" and
               e422[0]["token"] == "token2" and abs(e422[0]["time"] - s1["time"]) < 600,
               "the 422 is among the recent errors: route, status, code and token2's name", errs)
        tap.ok(errs and errs[0].get("code") == "unauthorized" and errs[0].get("token") == "anonymous" and
               errs[0].get("route") == "/v1/info", "the newest error is the bad token's 401, by anonymous", errs[:2])

        r = d.curl("GET", "/metrics", headers=bearer(ALICE))
        m = parse_metrics(r.body.decode())
        tap.ok(metric(m, "gemmd_token_products_total", token="alice") == a1["total"]["products"] and
               metric(m, "gemmd_token_products_total", token="token2") == t1["total"]["products"] and
               metric(m, "gemmd_token_requests_total", token="token2", code="422") == 1 and
               metric(m, "gemmd_token_requests_total", token="alice", code="200") >= 5 and
               metric(m, "gemmd_token_compute_seconds_total", token="alice") > 0 and
               metric(m, "gemmd_token_bytes_total", token="alice", direction="in") > 0,
               "/metrics: gemmd_token_* agree with /v1/status", {k: v for k, v in m.items() if "token" in k[0]})

        bodies = {"/v1/status": json.dumps(s1), "/metrics": r.body.decode(), "GET /": html}
        d.stop()
        bodies["the log"] = d.read_log()
        leaks = [where for where, text in bodies.items() if ALICE in text or TWO in text]
        tap.ok(not leaks, "no token's secret appears in /v1/status, /metrics, the page or the log", leaks)
        tap.ok("alice" in bodies["/v1/status"] and "token2" in bodies["/metrics"],
               "... while their names do")
    for p in os.listdir(tmp):
        os.unlink(os.path.join(tmp, p))
    os.rmdir(tmp)


def without_tokens(tap):
    with Daemon(tap, config={"backend": "cpu"}) as d:
        r = d.matmul_json([[1, 2]], [[3], [4]])
        tap.ok(r.status == 200, "a product without tokens_file", r)
        r, s = status(d)
        tap.ok(r.status == 200, "without tokens_file /v1/status needs no token", r)
        names = [t["name"] for t in s.get("tokens", [])]
        tap.ok(names == ["anonymous"] and token_use(s, "anonymous")["total"]["products"] == 1,
               "without tokens_file every request is the one user 'anonymous'", s.get("tokens"))
        r = d.curl("HEAD", "/", extra=["-I"])
        tap.ok(r.status == 200 and (r.header("content-type") or "").startswith("text/html"),
               "HEAD / answers the page's headers", r)


def main(tap):
    with_tokens(tap)
    without_tokens(tap)


if __name__ == "__main__":
    run_guarded(Tap(), main)
