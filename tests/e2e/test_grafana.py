#!/usr/bin/python3
"""test_grafana.py - deploy/grafana/gemmd.json only asks for what the daemon exports.

A CPU daemon with tokens is scraped (after a product and an error, so that the labelled
series exist); its metric families are the names of its `# TYPE` lines, with _bucket,
_sum and _count for histograms. Every PromQL expression of the dashboard (its panels'
targets and its template variables' queries, label_values(metric, label) read as the
metric) is read for the metric names it selects:
strings, label matchers, ranges, grouping clauses, Grafana variables, function and
aggregation names and keywords taken out, the identifiers left are metric names, and
each must be one the daemon exports. The dashboard is checked for its shape too (unique
panel ids, a grid position each, the datasource variable, one refId per target) and for
covering requests and latency by route, errors, the queue, devices, the memory budget,
connections and use by token.
"""
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import REPO, Daemon, Tap, run_guarded  # noqa: E402

DASHBOARD = os.path.join(REPO, "deploy", "grafana", "gemmd.json")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
            "offset", "inf", "nan", "atan2"}
COVERS = {
    "requests by route": "gemmd_requests_total",
    "latency by route": "gemmd_request_duration_seconds_bucket",
    "queue depth": "gemmd_queue_depth",
    "devices busy": "gemmd_device_utilization",
    "device memory": "gemmd_device_memory_used_bytes",
    "memory budget": "gemmd_memory_inflight_bytes",
    "connections": "gemmd_connections_open",
    "requests by token": "gemmd_token_requests_total",
    "compute by token": "gemmd_token_compute_seconds_total",
    "bytes by token": "gemmd_token_bytes_total",
}


def metric_names(expr):
    """The metric names a PromQL expression selects."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # strings
    e = re.sub(r"\$\{[^}]*\}|\$\w+", "", e)                                    # Grafana variables
    e = re.sub(r"\{[^{}]*\}", " ", e)                                           # label matchers
    e = re.sub(r"\[[^\[\]]*\]", " ", e)                                         # ranges, subqueries
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", e)
    e = re.sub(r"\b\d[\w.]*", " ", e)                                           # numbers, durations
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or m.group(0) in KEYWORDS:  # a function or aggregation, a keyword
            continue
        names.add(m.group(0))
    return names


def balanced(expr):
    depth = {"(": 0, "[": 0, "{": 0}
    close = {")": "(", "]": "[", "}": "{"}
    for c in re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr):
        if c in depth:
            depth[c] += 1
        elif c in close:
            depth[close[c]] -= 1
            if depth[close[c]] < 0:
                return False
    return not any(depth.values())


def exported(d, token):
    for body in (b'{"a": [[1, 2]], "b": [[3], [4]]}', b'{"a": [[1, 2]], "b": [[1, 2]]}'):  # a product, a 422
        d.curl("POST", "/v1/matmul", data=body, content_type="application/json",
               headers=["Authorization: Bearer " + token])
    r = d.curl("GET", "/metrics", headers=["Authorization: Bearer " + token])
    fams = set()
    for m in re.finditer(r"^# TYPE (\S+) (\S+)$", r.body.decode(), re.M):
        fams.add(m.group(1))
        if m.group(2) == "histogram":
            fams |= {m.group(1) + s for s in ("_bucket", "_sum", "_count")}
    return r, fams


def expressions(dash):
    """(where, expr) of every PromQL expression in the dashboard."""
    out = []
    panels = list(dash.get("panels", []))
    for p in list(panels):
        panels += p.get("panels", [])  # a collapsed row keeps its panels inside
    for p in panels:
        for t in p.get("targets", []):
            out.append(("panel %r target %s" % (p.get("title"), t.get("refId")), t.get("expr", "")))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else q or ""
        if v.get("type") == "query":  # Grafana's label_values(metric, label): the metric
            out.append(("variable %s" % v.get("name"), re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", q)))
    return panels, out


def shape(tap, dash, panels):
    ids = [p.get("id") for p in panels]
    tap.ok(dash.get("title") and dash.get("uid") and dash.get("schemaVersion") and len(ids) == len(set(ids)),
           "the dashboard has a title, uid, schemaVersion and unique panel ids", ids)
    bad = [p.get("title") for p in panels if not {"h", "w", "x", "y"} <= set(p.get("gridPos", {})) or
           (p.get("type") != "row" and (not p.get("targets") or
                                        p.get("datasource", {}).get("uid") != "${datasource}" or
                                        len({t.get("refId") for t in p["targets"]}) != len(p["targets"])))]
    tap.ok(not bad, "every panel has a grid position, targets with distinct refIds, and the datasource variable", bad)
    names = {v.get("name") for v in dash.get("templating", {}).get("list", [])}
    tap.ok({"datasource", "instance"} <= names, "template variables: datasource and instance", names)


def main(tap):
    tap.ok(metric_names('sum by (route) (rate(gemmd_x_total{code=~"5..", a="b{c}"}[$__rate_interval])) / '
                        'histogram_quantile(0.9, gemmd_y_bucket offset 5m) > bool 0') ==
           {"gemmd_x_total", "gemmd_y_bucket"}, "the extractor finds the metric names of an expression and no other")
    with open(DASHBOARD) as f:
        dash = json.load(f)
    panels, exprs = expressions(dash)
    shape(tap, dash, panels)
    tmp = tempfile.mkdtemp(prefix="gemmd-e2e-grafana-")
    tokens = os.path.join(tmp, "tokens")
    with open(tokens, "w") as f:
        f.write("grafana-user secret-%s\n" % os.urandom(6).hex())
    with open(tokens) as f:
        token = f.read().split()[1]
    with Daemon(tap, config={"backend": "cpu", "tokens_file": tokens}) as d:
        r, fams = exported(d, token)
        tap.ok(r.status == 200 and "gemmd_token_requests_total" in fams and
               "gemmd_request_duration_seconds_bucket" in fams, "the daemon's families (%d) are scraped" % len(fams), r)
        used, unknown, empty, unbalanced = set(), [], [], []
        for where, expr in exprs:
            names = metric_names(expr)
            used |= names
            unknown += ["%s: %s" % (where, n) for n in sorted(names - fams)]
            if not names:
                empty.append(where)
            if not balanced(expr):
                unbalanced.append(where)
        tap.ok(exprs and not unknown, "every metric the dashboard's %d expressions name is exported" % len(exprs),
               unknown)
        tap.ok(not empty and not unbalanced, "every expression names a metric and its brackets balance",
               (empty, unbalanced))
        missing = [what for what, name in COVERS.items() if name not in used]
        tap.ok(not missing, "the dashboard covers %s" % ", ".join(COVERS), missing)
    os.unlink(tokens)
    os.rmdir(tmp)


if __name__ == "__main__":
    run_guarded(Tap(), main)
