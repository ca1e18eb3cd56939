#!/usr/bin/python3
"""test_option_doors.py - every option of the table (GET /v1/info "options") at every door.

The doors: the query (of a raw body and of a multipart one), a form field, a JSON field and
a KServe v2 parameter. The list of options and their doors is read from /v1/info, so a new
row of the table is tried here without a line of this file changing. For each option:

- an invalid value (by its type; integers also below their min, above their max, as a JSON
  number and as a JSON array) gets the same status and code at every door that takes it,
  the row's own (v2: status 400, the protocol's status for what /v1 answers 422);
- its example value: an option of products (one JSON takes) gives, at every door, the same
  C and the same kernel, math and dtype reported, or the same refusal everywhere (not the
  option's own: the value was read); JSON and v2 also take it as a number when it is an
  integer. Other options: the value is read at the query (no "is not valid" refusal);
- a door that does not take it does what API.md says: the query, JSON and v2 ignore it (the
  same answer as without it), a form refuses it (400 unknown_part);
- given twice in one door: 400 duplicate_option, at every door (and in the query for a key
  that is not an option: ignored);
- a control byte (an encoded NUL, a tab, DEL) in a query value or key, a form field, a JSON
  string, a v2 parameter: 400;
- panel_of below m: 422 bad_option at every door (400 on v2), and a product that names it
  in bounds gets the same C everywhere.
"""
import json
import os
import sys
import urllib.parse

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, npy_bytes, run_guarded  # noqa: E402

INFER = "/v2/models/matmul/infer"
A = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)  # m=2, k=3, n=2
B = np.array([[1, -1], [2, 0], [0, 3]], dtype=np.float32)
BASE_QUERY = [("m", "2"), ("k", "3"), ("n", "2")]  # a raw body's shapes
JSON_KEYS = ("a", "b")  # a JSON body's own keys: its operands, never an option there
V2_DTYPES = {"FP32": "float32", "FP64": "float64", "INT32": "int32", "FP16": "float16", "BF16": "bfloat16"}


# ---------------------------------------------------------------------------- the doors
# Each sends the product A.B with options given as (name, value) pairs, the value a string
# or (JSON, v2) any JSON value; each gives back what the answer says, as a dict:
# status, code (errors), c (a float64 array), kernel, math, dtype.

def v1_answer(r):
    out = {"status": r.status}
    j = r.json() if r.body else None
    if r.status >= 400:
        out["code"], out["message"] = r.error()
    elif isinstance(j, dict) and "c" in j:
        out.update(c=np.array(j["c"], dtype=np.float64), kernel=j.get("kernel"), math=j.get("math"),
                   dtype=j.get("dtype"))
    return out


def v2_answer(r):
    out = {"status": r.status}
    j = r.json() or {}
    if r.status >= 400:
        out["code"], out["message"] = j.get("code"), j.get("error")
    elif j.get("outputs"):
        o, p = j["outputs"][0], j.get("parameters", {})
        out.update(c=np.array(o["data"], dtype=np.float64).reshape(o["shape"]), kernel=p.get("kernel"),
                   math=p.get("math"), dtype=V2_DTYPES.get(o.get("datatype")))
    return out


def query_string(pairs):
    return "?" + "&".join("%s=%s" % (urllib.parse.quote(k, safe=""), urllib.parse.quote(v, safe=""))
                          for k, v in pairs) if pairs else ""


def with_base(opts, base):
    """The base pairs, each replaced by the option of that name when one is given."""
    names = {k for k, _ in opts}
    return [(k, v) for k, v in base if k not in names] + list(opts)


def send_query_raw(d, opts, raw_pairs=None):
    pairs = raw_pairs if raw_pairs is not None else with_base(opts, BASE_QUERY)
    r = d.curl("POST", "/v1/matmul" + query_string(pairs), data=A.tobytes() + B.tobytes(),
               content_type="application/octet-stream", accept="application/json")
    return v1_answer(r)


def form_files(d):
    paths = []
    for name, arr in (("a", A), ("b", B)):
        p = os.path.join(d.tmp.name, "%s.npy" % name)
        with open(p, "wb") as f:
            f.write(npy_bytes(arr))
        paths.append(p)
    return ["a=@" + paths[0], "b=@" + paths[1]]


def send_query_npy(d, opts, raw_pairs=None):
    pairs = raw_pairs if raw_pairs is not None else list(opts)
    return v1_answer(d.curl("POST", "/v1/matmul" + query_string(pairs), form=form_files(d),
                            accept="application/json"))


def send_form(d, opts):
    extra = []
    for k, v in opts:
        extra += ["--form-string", "%s=%s" % (k, v)]
    return v1_answer(d.curl("POST", "/v1/matmul", form=form_files(d), extra=extra, accept="application/json"))


def json_object(pairs):
    """An object's text from (key, value) pairs: a key may come twice."""
    return "{" + ", ".join("%s: %s" % (json.dumps(k), json.dumps(v)) for k, v in pairs) + "}"


def send_json(d, opts):
    body = json_object([("a", A.tolist()), ("b", B.tolist()), ("dtype", "float32")] if not any(
        k == "dtype" for k, _ in opts) else [("a", A.tolist()), ("b", B.tolist())])
    body = body[:-1] + "".join(", %s: %s" % (json.dumps(k), json.dumps(v)) for k, v in opts) + "}"
    return v1_answer(d.curl("POST", "/v1/matmul", data=body.encode(), content_type="application/json"))


def send_v2(d, opts):
    inputs = [{"name": n, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
              for n, x in (("A", A), ("B", B))]
    body = '{"inputs": %s, "parameters": %s}' % (json.dumps(inputs), json_object(opts))
    return v2_answer(d.curl("POST", INFER, data=body.encode(), content_type="application/json"))


SENDERS = {"query": [("query (raw)", send_query_raw), ("query (multipart)", send_query_npy)],
           "form": [("form field", send_form)], "json": [("JSON field", send_json)], "v2": [("v2 parameter", send_v2)]}


def door_senders(doors):
    return [(label, fn, door) for door in doors for label, fn in SENDERS.get(door, [])]


# ---------------------------------------------------------------------------- comparing

def outcome(a, v2_status):
    """What an answer says, to compare: C, kernel, math and dtype, or the refusal. With
    v2_status, a /v1 422 counts as v2's 400 (the protocol's status for it)."""
    if a["status"] >= 400:
        return ("error", a.get("code"), 400 if v2_status and a["status"] == 422 else a["status"])
    c = a.get("c")
    return ("ok", a["status"], None if c is None else c.tobytes(), a.get("kernel"), a.get("math"), a.get("dtype"))


def same_outcome(answers):
    """Whether answers [(label, door, answer)] agree: the /v1 doors exactly, v2 with them
    but for its 400 where /v1 says 422."""
    v1 = {outcome(a, False) for _, door, a in answers if door != "v2"}
    return len(v1) <= 1 and len({outcome(a, True) for _, _, a in answers}) == 1


def summary(answers):
    return [(label, a["status"], a.get("code"), a.get("message") or (a.get("c").tolist() if a.get("c") is not None
                                                                      else None)) for label, _, a in answers]


def invalid_values(opt):
    """Text values the option's type refuses, and JSON values (JSON and v2 doors) it refuses."""
    t = opt["type"]
    texts = {"dtype": ["float8"], "math": ["fp8"], "kernel": ["Bad!"], "flag": ["maybe"], "id": [""],
             "integer": ["x!", "-1"]}.get(t, ["\x7f"])
    typed = [[opt.get("example") or "x"]]  # an array: no option takes one
    if t == "integer":
        if opt["min"] > 0:
            texts.append(str(opt["min"] - 1))
            typed.append(opt["min"] - 1)
        if "max" in opt:
            texts.append(str(opt["max"] + 1))
            typed.append(opt["max"] + 1)
        typed.append(2.5)
    elif t != "flag":
        typed.append(7)  # names take strings only
    return texts, typed


# ---------------------------------------------------------------------------- the checks

def check_option(tap, d, opt, base):
    name, doors = opt["name"], opt["doors"]
    senders = door_senders(doors)
    texts, typed = invalid_values(opt)
    for bad in texts:
        answers = [(label, door, fn(d, [(name, bad)])) for label, fn, door in senders]
        ok = same_outcome(answers) and all(a.get("code") == opt["code"] and
                                           a["status"] == (400 if door == "v2" else opt["status"])
                                           for _, door, a in answers)
        tap.ok(ok, "%s=%r: %d %s at every door (%s)" % (name, bad, opt["status"], opt["code"], ", ".join(doors)),
               summary(answers))
    typed_senders = [s for s in senders if s[2] in ("json", "v2")]
    for bad in typed if typed_senders else []:
        answers = [(label, door, fn(d, [(name, bad)])) for label, fn, door in typed_senders]
        ok = all(a.get("code") == opt["code"] and a["status"] in (400, opt["status"]) for _, _, a in answers)
        tap.ok(ok and same_outcome(answers), "%s: %s (as JSON): %s at the JSON doors" % (name, json.dumps(bad),
                                                                                         opt["code"]),
               summary(answers))

    example = opt.get("example")
    if example is not None and "json" in doors:
        answers = [(label, door, fn(d, [(name, example)])) for label, fn, door in senders]
        if opt["type"] == "integer":
            answers += [(label + " (a number)", door, fn(d, [(name, int(example))]))
                        for label, fn, door in typed_senders]
        read = all(not (a.get("code") == opt["code"] and "is not valid" in (a.get("message") or ""))
                   for _, _, a in answers)
        tap.ok(read and same_outcome(answers),
               "%s=%s: the same answer at every door (C, kernel, math, dtype)" % (name, example), summary(answers))
    elif example is not None:
        a = send_query_raw(d, [(name, example)])
        tap.ok(a["status"] < 500 and not (a.get("code") == opt["code"] and "is not valid" in (a.get("message") or "")),
               "%s=%s (query only): read" % (name, example), a)

    # the doors that do not take it
    value = example if example is not None else "0" * 32
    for door in ("query", "form", "json", "v2"):
        if door in doors or (door == "json" and name in JSON_KEYS):
            continue
        for label, fn, _ in door_senders([door]):
            a = fn(d, [(name, value)])
            if door == "form":
                ok = a["status"] == 400 and a.get("code") == "unknown_part" and name in (a.get("message") or "")
                tap.ok(ok, "%s as a %s: 400 unknown_part" % (name, label), a)
            else:
                want = base[door]
                ok = same_outcome([("base", door, want), (label, door, a)])
                tap.ok(ok, "%s as a %s: ignored (the answer without it)" % (name, label), (a, want))

    # twice in one door
    for label, fn, door in senders:
        if fn in (send_query_raw, send_query_npy):
            pairs = [(name, value), (name, value)]
            a = fn(d, None, raw_pairs=(with_base(pairs, BASE_QUERY) if fn is send_query_raw else pairs))
        else:
            a = fn(d, [(name, value), (name, value)])
        tap.ok(a["status"] == 400 and a.get("code") == "duplicate_option" and name in (a.get("message") or ""),
               "%s twice in the %s: 400 duplicate_option" % (name, label), a)


def control_bytes(tap, d):
    for q, code, what in (("?m=2%00&k=3&n=2", "bad_dimension", "an encoded NUL in m (m=2%00)"),
                          ("?m=2&k=3&n=2&dtype=float32%00", "bad_option", "an encoded NUL in dtype"),
                          ("?m=2&k=3&n=2&kernel=auto%09", "bad_option", "a tab in kernel"),
                          ("?m=2&k=3&n=2&x=%7F", "bad_option", "DEL in another argument's value"),
                          ("?m=2&k=3&n=2&dtype%00=float8", "bad_option", "a NUL inside a key (dtype%00)"),
                          ("?m=2&k%0A=3&n=2", "bad_option", "a line feed inside a key")):
        r = d.curl("POST", "/v1/matmul" + q, data=A.tobytes() + B.tobytes(), content_type="application/octet-stream")
        tap.ok(r.status == 400 and r.error()[0] == code, "query with %s: 400 %s" % (what, code), r)
    a = send_form(d, [("kernel", "auto\x01")])
    tap.ok(a["status"] == 400 and a.get("code") == "bad_option", "a form field with a control byte: 400", a)
    a = send_json(d, [("kernel", "auto\u0000")])
    tap.ok(a["status"] == 400 and a.get("code") == "bad_option", "a JSON option holding \\u0000: 400", a)
    a = send_v2(d, [("kernel", "auto\u0000")])
    tap.ok(a["status"] == 400 and a.get("code") == "bad_parameter", "a v2 parameter holding \\u0000: 400", a)
    a = send_v2(d, [("kernel\u0000x", "Bad!")])
    tap.ok(a["status"] == 400 and a.get("code") == "bad_parameter", "a v2 parameter name holding \\u0000: 400", a)
    a = send_form(d, [("dtype", "float32" + "0" * 300)])
    tap.ok(a["status"] == 422 and a.get("code") == "bad_option", "a form field longer than any value: 422", a)
    a = send_form(d, [("kernel", "auto\r\n")])
    tap.ok(a["status"] == 200, "a form field's line ending is not part of its value", a)
    # a key that is not an option, twice: ignored
    a = send_query_raw(d, None, raw_pairs=BASE_QUERY + [("note", "1"), ("note", "2")])
    tap.ok(a["status"] == 200, "a query key that is not an option, twice: ignored", a)


def panel_of(tap, d):
    """The option exists to make panels byte-identical: every door honours it or refuses it
    with the same error."""
    senders = door_senders(["query", "form", "json", "v2"])
    answers = [(label, door, fn(d, [("panel_of", "1")])) for label, fn, door in senders]
    tap.ok(same_outcome(answers) and all(a.get("code") == "bad_option" for _, _, a in answers)
           and all(a["status"] == (400 if door == "v2" else 422) for _, door, a in answers),
           "panel_of=1 below m=2: 422 bad_option at every door (400 on v2)", summary(answers))
    answers = [(label, door, fn(d, [("panel_of", "9")])) for label, fn, door in senders]
    want = (A.astype(np.float64) @ B.astype(np.float64))
    tap.ok(same_outcome(answers) and all(a["status"] == 200 and np.array_equal(a["c"], want) for _, _, a in answers),
           "panel_of=9: C at every door", summary(answers))


def main(tap):
    with Daemon(tap) as d:
        info = d.curl("GET", "/v1/info").json() or {}
        opts = info.get("options") or []
        tap.ok(len(opts) >= 19 and all({"name", "type", "doors", "status", "code", "help"} <= set(o) for o in opts),
               "/v1/info lists the options' table: name, type, doors, status, code, help", opts[:2])
        names = [o.get("name") for o in opts]
        tap.ok(len(set(names)) == len(names) and "panel_of" in names, "each option once, panel_of among them", names)
        base = {"query": send_query_raw(d, []), "json": send_json(d, []), "v2": send_v2(d, [])}
        want = A.astype(np.float64) @ B.astype(np.float64)
        tap.ok(all(b["status"] == 200 and np.array_equal(b.get("c"), want) for b in base.values()),
               "the product without options at the query, JSON and v2 doors", base)
        for opt in opts:
            check_option(tap, d, opt, base)
        control_bytes(tap, d)
        panel_of(tap, d)
        r = d.curl("GET", "/healthz")
        tap.ok(r.status == 200, "the daemon still answers", r)


if __name__ == "__main__":
    from harness import Tap
    run_guarded(Tap(), main)
