#!/usr/bin/python3
"""test_openapi.py - docs/openapi.yaml and API.md's options table against the code.

- Routes: code_routes() lists them from the route table (server/routes.c, as GET /v1/info
  lists it); the running daemon agrees (a method it
  does not take is 405 with exactly those methods in Allow); openapi.yaml has every route
  with every method (HEAD goes with GET).
- Options: every option of the table (GET /v1/info "options") is in openapi.yaml at each of
  its doors: a query parameter of some operation (query), a property of the form schema
  (form), of the JSON body schema (json), of the v2 request's parameters (v2); and it is a
  row of API.md's options table naming exactly its doors.
"""
import os
import re
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import REPO, Daemon, run_guarded  # noqa: E402


def read(path):
    with open(os.path.join(REPO, path)) as f:
        return f.read()


def code_routes(info):
    """{path: set of methods} of every route: the route table (server/routes.c) as GET
    /v1/info lists it, so that a new row is checked without touching this test."""
    routes = {}
    for r in info.get("routes") or []:
        routes.setdefault(r["path"], set()).update(r["methods"])
    return routes


def concrete(path):
    return path.replace("{id}", "0" * 32).replace("{model}", "matmul").replace("{version}", "1")


def option_table(text):
    """API.md's options table: {name: doors text}."""
    sec = text[text.index("## Options"):]
    sec = sec[:sec.index("\n## ", 5)]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| ([^|]+) \|", sec, re.M)}


def main(tap):
    spec = yaml.safe_load(read("docs/openapi.yaml"))
    paths = spec.get("paths", {})
    comps = spec.get("components", {})

    with Daemon(tap) as d:
        info = d.curl("GET", "/v1/info").json() or {}
    routes = code_routes(info)
    tap.ok(len(routes) >= 18 and {"/v1/matmul", "/v1/matrices/{id}", "/v1/jobs/{id}/result", "/healthz"} <= set(routes)
           and "PUT" in routes.get("/v1/matrices/{id}", ()), "the routes read from the code", sorted(routes))
    missing = []
    for path, methods in sorted(routes.items()):
        for meth in sorted(methods - {"HEAD"}):
            if meth.lower() not in (paths.get(path) or {}):
                missing.append("%s %s" % (meth, path))
    tap.ok(not missing, "openapi.yaml has every route and method of the code", missing)
    extra = sorted(p for p in paths if p not in routes)
    tap.ok(not extra, "openapi.yaml has no route the code lacks", extra)

    with Daemon(tap) as d:
        for path, methods in sorted(routes.items()):
            r = d.curl("PATCH", concrete(path))
            allow = {x.strip() for x in (r.header("allow") or "").split(",") if x.strip()}
            tap.ok(r.status == 405 and allow == methods, "PATCH %s: 405, Allow: %s" % (path, ", ".join(sorted(methods))),
                   (r.status, r.header("allow")))
        opts = (d.curl("GET", "/v1/info").json() or {}).get("options") or []
    tap.ok(len(opts) >= 19, "/v1/info lists the options", len(opts))

    def deref(node):
        while isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            node = comps
            for part in ref.split("/")[2:]:
                node = node[part]
        return node

    query = set()
    for item in paths.values():
        for op in [item] + [v for v in item.values() if isinstance(v, dict)]:
            for p in op.get("parameters", []) if isinstance(op.get("parameters"), list) else []:
                p = deref(p)
                if p.get("in") == "query":
                    query.add(p.get("name"))
    schemas = comps.get("schemas", {})
    form = set(schemas.get("NpyParts", {}).get("properties", {}))
    body = set(schemas.get("MatmulJson", {}).get("properties", {})) - {"a", "b"}
    v2 = set(schemas.get("V2InferRequest", {}).get("properties", {}).get("parameters", {}).get("properties", {}))
    where = {"query": query, "form": form, "json": body, "v2": v2}
    api = option_table(read("docs/API.md"))
    for o in opts:
        name, doors = o["name"], o["doors"]
        lacks = [door for door in doors if name not in where.get(door, ())]
        tap.ok(not lacks, "openapi.yaml: %s at its doors (%s)" % (name, ", ".join(doors)), lacks)
        says = {w.strip().lower() for w in re.split(r",", (api.get(name) or "").replace("JSON", "json"))} - {""}
        tap.ok(says == set(doors), "API.md's options table: %s with its doors" % name, (api.get(name), doors))
    names = {o["name"] for o in opts}
    tap.ok(set(api) == names, "API.md's options table has the table's options and no others",
           sorted(set(api) ^ names))


if __name__ == "__main__":
    from harness import Tap
    run_guarded(Tap(), main)
