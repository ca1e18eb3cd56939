#!/usr/bin/python3
"""test_half.py - float16 and bfloat16 operands end to end, on the CPU backend.

Every request format (JSON nested with the dtype first, JSON {"shape","data"} with the dtype
last, raw binary, multipart .npy, the KServe v2 route with JSON and binary tensor data) x
{float16, bfloat16} x {C in float32 (the default), C in the operands' dtype (out_dtype)} x
every answer format, at odd shapes; then the `gemm` command with .npy and raw files, and the
errors: bad out_dtype values, out_dtype for other dtypes, mismatched dtypes, wrong body
lengths, values beyond the range, .npy descrs.

References are independent of the code under test: the inputs are drawn in float64 and
rounded to the dtype here (float16: NumPy's astype, which rounds once, to nearest even;
bfloat16: NumPy integer arithmetic on the float64 bits, also one rounding), and C is NumPy's
float64 product of those rounded values. JSON requests send the unrounded float64 values,
so the server's rounding of JSON numbers is checked too (the rounded values must give the
same C). Tolerance: the server sums in float32, so |C - ref| <= 1e-5 k + 1e-6 as for float32
products of inputs in [-1, 1] (k terms, each rounding at most 2^-24 relative, with margin);
C asked in the half dtype adds its own rounding, half a unit in the last place: 2^-11 |ref|
(float16) or 2^-8 |ref| (bfloat16), plus 2^-25 for float16's subnormals.
"""
import json
import os
import re
import struct
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, Tap, load_npy, run_guarded  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEMM_BIN = os.environ.get("GEMM_BIN", "bin/gemm")
if not os.path.isabs(GEMM_BIN):
    GEMM_BIN = os.path.join(REPO, GEMM_BIN)

DTYPES = ["float16", "bfloat16"]
SHAPES = [(1, 1, 1), (7, 13, 5), (33, 70, 19), (1, 300, 2)]
INPUTS = ["json-nested", "json-shape-data", "raw", "npy", "v2-json", "v2-binary"]
ANSWERS = {"json": "application/json", "octet": "application/octet-stream", "npy": "application/x-npy"}
V2 = {"float16": "FP16", "bfloat16": "BF16", "float32": "FP32"}
DESCR = {"float16": "<f2", "bfloat16": "<V2", "float32": "<f4"}


# ---------------------------------------------------------------- the dtypes, independently

def bf16_bits(x):
    """float64 array -> bfloat16 bits (uint16), rounded once to nearest even: the float64
    significand cut at bit 45 (bfloat16 keeps 8 of its 53 bits), then the top half of the
    float32 it now equals exactly. Finite values of normal bfloat16 range only."""
    b = np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)
    r = (b + np.uint64((1 << 44) - 1) + ((b >> np.uint64(45)) & np.uint64(1))) & ~np.uint64((1 << 45) - 1)
    f = r.view(np.float64).astype(np.float32)
    return (f.view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def bf16_values(bits):
    return (np.asarray(bits, dtype=np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def to_dtype(x, dtype):
    """(bytes-ready array of the dtype's bits or values, float64 values of the elements)."""
    if dtype == "float16":
        h = x.astype(np.float16)
        return h, h.astype(np.float64)
    bits = bf16_bits(x)
    return bits, bf16_values(bits)


def from_answer_bytes(data, dtype, shape):
    if dtype == "float32":
        return np.frombuffer(data, dtype="<f4").reshape(shape).astype(np.float64)
    if dtype == "float16":
        return np.frombuffer(data, dtype="<f2").reshape(shape).astype(np.float64)
    return bf16_values(np.frombuffer(data, dtype="<u2")).reshape(shape)


def npy_file(bits_or_vals, dtype):
    """A .npy file as np.save writes it (bfloat16: the '<V2' header ml_dtypes arrays get)."""
    a = np.ascontiguousarray(bits_or_vals)
    rows, cols = a.shape
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%d, %d), }" % (DESCR[dtype], rows, cols)
    total = 10 + len(d) + 1
    pad = (64 - total % 64) % 64
    hdr = d + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + a.astype(
        "<f2" if dtype == "float16" else "<u2").tobytes()


def npy_descr(data):
    m = re.search(rb"'descr':\s*'([^']*)'", data[:256])
    return m.group(1).decode() if m else None


def tolerance(cd, k, ref):
    tol = 1e-5 * k + 1e-6
    if cd == "float16":
        tol = tol + 2.0 ** -11 * np.abs(ref) + 2.0 ** -25
    elif cd == "bfloat16":
        tol = tol + 2.0 ** -8 * np.abs(ref)
    return tol


def close(c, ref, cd, k):
    if c.shape != ref.shape:
        return False, "shape %r, want %r" % (c.shape, ref.shape)
    bad = np.argwhere(~(np.abs(c - ref) <= tolerance(cd, k, ref)))
    if len(bad):
        i = tuple(bad[0])
        return False, "%d elements differ; first at %r: got %r want %r" % (len(bad), i, c[i], ref[i])
    return True, ""


# ---------------------------------------------------------------- requests

def send(d, fmt, x, y, xe, ye, dtype, out, accept):
    """x, y: the unrounded float64 inputs; xe, ye: the dtype's elements (bits or values)."""
    if fmt == "json-nested":
        body = {"dtype": dtype, "a": x.tolist(), "b": y.tolist()}
        if out:
            body["out_dtype"] = out
        return d.curl("POST", "/v1/matmul", data=json.dumps(body).encode(), content_type="application/json",
                      accept=accept)
    if fmt == "json-shape-data":  # dtype last: held as float64, rounded at the end
        body = {"a": {"shape": list(x.shape), "data": x.ravel().tolist()},
                "b": {"shape": list(y.shape), "data": y.ravel().tolist()}, "dtype": dtype}
        if out:
            body["out_dtype"] = out
        return d.curl("POST", "/v1/matmul", data=json.dumps(body).encode(), content_type="application/json",
                      accept=accept)
    if fmt == "raw":
        q = "?m=%d&k=%d&n=%d&dtype=%s%s" % (x.shape[0], x.shape[1], y.shape[1], dtype,
                                              "&out_dtype=" + out if out else "")
        return d.curl("POST", "/v1/matmul" + q, data=xe.tobytes() + ye.tobytes(),
                      content_type="application/octet-stream", accept=accept)
    if fmt == "npy":
        pa, pb = os.path.join(d.tmp.name, "A.npy"), os.path.join(d.tmp.name, "B.npy")
        with open(pa, "wb") as f:
            f.write(npy_file(xe, dtype))
        with open(pb, "wb") as f:
            f.write(npy_file(ye, dtype))
        form = ["a=@" + pa, "b=@" + pb] + (["out_dtype=" + out] if out else [])
        return d.curl("POST", "/v1/matmul", form=form, accept=accept)
    raise ValueError(fmt)


def send_v2(d, fmt, x, y, xe, ye, dtype, out):
    """The v2 route: JSON data (the unrounded values) or binary tensor data (the elements)."""
    params = {"out_dtype": V2[out]} if out else {}
    if fmt == "v2-json":
        req = {"inputs": [{"name": "A", "shape": list(x.shape), "datatype": V2[dtype], "data": x.ravel().tolist()},
                          {"name": "B", "shape": list(y.shape), "datatype": V2[dtype], "data": y.ravel().tolist()}],
               "parameters": params}
        return d.curl("POST", "/v2/models/matmul/infer", data=json.dumps(req).encode(),
                      content_type="application/json")
    ab, bb = xe.tobytes(), ye.tobytes()
    params = dict(params, binary_data_output=True)
    req = {"inputs": [{"name": "A", "shape": list(x.shape), "datatype": V2[dtype],
                       "parameters": {"binary_data_size": len(ab)}},
                      {"name": "B", "shape": list(y.shape), "datatype": V2[dtype],
                       "parameters": {"binary_data_size": len(bb)}}],
           "parameters": params}
    head = json.dumps(req).encode()
    return d.curl("POST", "/v2/models/matmul/infer", data=head + ab + bb,
                  content_type="application/octet-stream",
                  headers=["Inference-Header-Content-Length: %d" % len(head)])


def decode(r, fmt, answer, cd, shape):
    """C as float64 from an answer, or (None, why); checks it says its dtype."""
    if fmt.startswith("v2"):
        if fmt == "v2-json":
            j = r.json() or {}
            o = (j.get("outputs") or [{}])[0]
            if o.get("datatype") != V2[cd]:
                return None, "datatype %r" % o.get("datatype")
            return np.array(o.get("data"), dtype=np.float64).reshape(shape), ""
        hl = int(r.header("inference-header-content-length") or -1)
        if hl < 0:
            return None, "no Inference-Header-Content-Length"
        head = json.loads(r.body[:hl])
        o = head["outputs"][0]
        if o.get("datatype") != V2[cd]:
            return None, "datatype %r" % o.get("datatype")
        return from_answer_bytes(r.body[hl:], cd, shape), ""
    if answer == "json":
        j = r.json() or {}
        if j.get("dtype") != cd:
            return None, "dtype %r" % j.get("dtype")
        return np.array(j["c"], dtype=np.float64), ""
    if answer == "octet":
        if r.header("x-gemm-dtype") != cd:
            return None, "X-Gemm-Dtype %r" % r.header("x-gemm-dtype")
        return from_answer_bytes(r.body, cd, shape), ""
    if npy_descr(r.body) != DESCR[cd]:
        return None, "npy descr %r" % npy_descr(r.body)
    if cd == "bfloat16":
        hl = struct.unpack("<H", r.body[8:10])[0]
        return from_answer_bytes(r.body[10 + hl:], cd, shape), ""
    return load_npy(r.body).astype(np.float64), ""


# ---------------------------------------------------------------- the checks

def products(tap, d):
    rng = np.random.default_rng(14)
    for dtype in DTYPES:
        for m, k, n in SHAPES:
            x = rng.uniform(-1, 1, size=(m, k))
            y = rng.uniform(-1, 1, size=(k, n))
            xe, xv = to_dtype(x, dtype)
            ye, yv = to_dtype(y, dtype)
            ref = xv @ yv
            for out in (None, dtype, "float32"):
                cd = out or "float32"
                for fmt in INPUTS:
                    answers = ["json"] if fmt.startswith("v2") else list(ANSWERS)
                    for answer in answers:
                        name = "%s %dx%dx%d %s out %s -> %s" % (dtype, m, k, n, fmt, out or "(default)",
                                                                 "v2" if fmt.startswith("v2") else answer)
                        if fmt.startswith("v2"):
                            r = send_v2(d, fmt, x, y, xe, ye, dtype, out)
                        else:
                            r = send(d, fmt, x, y, xe, ye, dtype, out, ANSWERS[answer])
                        if r.status != 200:
                            tap.ok(False, name, "%d %s" % (r.status, r.body[:300]))
                            continue
                        c, why = decode(r, fmt, answer, cd, (m, n))
                        if c is None:
                            tap.ok(False, name, why)
                            continue
                        ok, why = close(c, ref, cd, k)
                        tap.ok(ok, name, why)


def batched(tap, d):
    """?batch= with float16 / bfloat16: a stack of As, with own Bs and with one shared B."""
    rng = np.random.default_rng(5)
    nb, m, k, n = 3, 4, 9, 5
    for dtype in DTYPES:
        for shared in (0, 1):
            for out in (None, dtype):
                x = rng.uniform(-1, 1, size=(nb, m, k))
                y = rng.uniform(-1, 1, size=(1 if shared else nb, k, n))
                xe, xv = to_dtype(x, dtype)
                ye, yv = to_dtype(y, dtype)
                q = "?m=%d&k=%d&n=%d&dtype=%s&batch=%d%s%s" % (m, k, n, dtype, nb, "&b_shared=1" if shared else "",
                                                               "&out_dtype=" + out if out else "")
                r = d.curl("POST", "/v1/matmul" + q, data=xe.tobytes() + ye.tobytes(),
                           content_type="application/octet-stream", accept="application/octet-stream")
                cd = out or "float32"
                name = "%s batch of %d (%s B) out %s" % (dtype, nb, "shared" if shared else "own", cd)
                if r.status != 200 or r.header("x-gemm-dtype") != cd:
                    tap.ok(False, name, "%d %s %s" % (r.status, r.header("x-gemm-dtype"), r.body[:200]))
                    continue
                c = from_answer_bytes(r.body, cd, (nb, m, n))
                ref = np.stack([xv[i] @ yv[0 if shared else i] for i in range(nb)])
                ok, why = close(c, ref, cd, k)
                tap.ok(ok, name, why)


def errors(tap, d):
    a16 = np.ones((2, 3), dtype=np.float16)
    b16 = np.ones((3, 2), dtype=np.float16)

    def expect(r, status, code, needle, name):
        e = (r.json() or {}).get("error", {}) if r.body[:1] == b"{" else {}
        if isinstance(e, str):  # the v2 route: {"error": "message"}, as the protocol has it
            e = {"code": code, "message": e}
        tap.ok(r.status == status and e.get("code") == code and needle in e.get("message", ""), name,
               "%d %s" % (r.status, r.body[:300]))

    raw = a16.tobytes() + b16.tobytes()
    q = "/v1/matmul?m=2&k=3&n=2&dtype=float16"
    expect(d.curl("POST", q + "&out_dtype=float8", data=raw, content_type="application/octet-stream"),
           422, "bad_out_dtype", "float8", "out_dtype=float8 is 422 bad_out_dtype")
    expect(d.curl("POST", q + "&out_dtype=float64", data=raw, content_type="application/octet-stream"),
           422, "bad_out_dtype", "float32 (the default) or float16", "float16 with out_dtype=float64 is refused")
    expect(d.curl("POST", q + "&out_dtype=bfloat16", data=raw, content_type="application/octet-stream"),
           422, "bad_out_dtype", "bfloat16", "float16 with out_dtype=bfloat16 is refused")
    f32 = np.ones((2, 3), np.float32).tobytes() + np.ones((3, 2), np.float32).tobytes()
    expect(d.curl("POST", "/v1/matmul?m=2&k=3&n=2&dtype=float32&out_dtype=float16", data=f32,
                  content_type="application/octet-stream"),
           422, "bad_out_dtype", "float32 operands", "float32 with out_dtype=float16 is refused (no conversions)")
    r = d.curl("POST", "/v1/matmul?m=2&k=3&n=2&dtype=float32&out_dtype=float32", data=f32,
               content_type="application/octet-stream", accept="application/octet-stream")
    tap.ok(r.status == 200 and r.header("x-gemm-dtype") == "float32", "float32 with out_dtype=float32 is fine",
           "%d %s" % (r.status, r.body[:200]))
    expect(d.curl("POST", "/v1/matmul", data=json.dumps({"a": [[1]], "b": [[2]], "out_dtype": "float16"}).encode(),
                  content_type="application/json"),
           422, "bad_out_dtype", "float64 operands", "JSON float64 with out_dtype=float16 is refused")
    expect(d.curl("POST", q, data=raw[:-2], content_type="application/octet-stream"),
           400, "length_mismatch", "float16", "a float16 raw body 2 bytes short is 400 length_mismatch")
    expect(d.curl("POST", q, data=np.ones(12, np.float32).tobytes()[:24] + raw, content_type="application/octet-stream"),
           400, "length_mismatch", "need 24 bytes", "a raw body of float32 size for float16 is 400 length_mismatch")
    expect(d.curl("POST", "/v1/matmul", data=json.dumps({"dtype": "float16", "a": [[70000.0]], "b": [[1]]}).encode(),
                  content_type="application/json"),
           422, "bad_value", "float16's range", "a JSON value beyond float16 is 422 bad_value")
    expect(d.curl("POST", "/v1/matmul", data=json.dumps({"a": [[1e39]], "b": [[1]], "dtype": "bfloat16"}).encode(),
                  content_type="application/json"),
           422, "bad_value", "bfloat16's range", "a JSON value beyond bfloat16 (dtype last) is 422 bad_value")
    pa, pb = os.path.join(d.tmp.name, "E1.npy"), os.path.join(d.tmp.name, "E2.npy")
    with open(pa, "wb") as f:
        f.write(npy_file(a16, "float16"))
    with open(pb, "wb") as f:
        f.write(npy_file(np.ones((3, 2), np.uint16), "bfloat16"))
    expect(d.curl("POST", "/v1/matmul", form=["a=@" + pa, "b=@" + pb]), 422, "dtype_mismatch", "bfloat16",
           "npy float16 with npy bfloat16 is 422 dtype_mismatch")
    with open(pb, "wb") as f:
        f.write(npy_file(np.ones((3, 2), np.uint16), "bfloat16").replace(b"'<V2'", b"'|V2'"))
    expect(d.curl("POST", "/v1/matmul", form=["a=@" + pa, "b=@" + pb]), 415, "unsupported_dtype", "'<V2'",
           "npy descr '|V2' is 415 and names the bfloat16 form '<V2'")
    expect(d.curl("POST", "/v2/models/matmul/infer", data=json.dumps({
        "inputs": [{"name": "A", "shape": [1, 1], "datatype": "FP16", "data": [1]},
                   {"name": "B", "shape": [1, 1], "datatype": "FP16", "data": [1]}],
        "parameters": {"out_dtype": "FP64"}}).encode(), content_type="application/json"),
        400, "bad_out_dtype", "float64", "v2 FP16 with parameters.out_dtype FP64 is 400")
    r = d.curl("GET", "/v2/models/matmul")
    dts = ((r.json() or {}).get("parameters") or {}).get("datatypes", "")
    tap.ok(r.status == 200 and "FP16" in dts.split(",") and "BF16" in dts.split(","),
           "v2 model metadata lists FP16 and BF16", dts)
    info = d.curl("GET", "/v1/info").json() or {}
    tap.ok({"float16", "bfloat16"} <= set(info.get("dtypes", [])), "/v1/info lists float16 and bfloat16",
           repr(info.get("dtypes")))
    # an async job: its status says both dtypes, its result is C's
    r = d.curl("POST", "/v1/jobs?m=2&k=3&n=2&dtype=float16&out_dtype=float16", data=raw,
               content_type="application/octet-stream")
    jid = (r.json() or {}).get("id")
    st = {}
    for _ in range(200):
        st = d.curl("GET", "/v1/jobs/%s" % jid).json() or {}
        if st.get("state") in ("done", "failed"):
            break
    res = d.curl("GET", "/v1/jobs/%s/result" % jid, accept="application/octet-stream")
    tap.ok(st.get("dtype") == "float16" and st.get("out_dtype") == "float16" and res.status == 200 and
           res.header("x-gemm-dtype") == "float16" and
           np.array_equal(np.frombuffer(res.body, "<f2"), np.full(4, 3, np.float16)),
           "an async float16 job: status dtype and out_dtype, result in float16", "%r %d" % (st, res.status))


def cli(tap, d):
    """gemm multiply with float16 / bfloat16 .npy and raw files, C in both dtypes."""
    rng = np.random.default_rng(9)
    tmp = d.tmp.name
    for dtype in DTYPES:
        x, y = rng.uniform(-1, 1, size=(6, 11)), rng.uniform(-1, 1, size=(11, 4))
        xe, xv = to_dtype(x, dtype)
        ye, yv = to_dtype(y, dtype)
        ref = xv @ yv
        pa, pb = os.path.join(tmp, "a_%s.npy" % dtype), os.path.join(tmp, "b_%s.npy" % dtype)
        with open(pa, "wb") as f:
            f.write(npy_file(xe, dtype))
        with open(pb, "wb") as f:
            f.write(npy_file(ye, dtype))
        ra, rb = os.path.join(tmp, "a_%s.bin" % dtype), os.path.join(tmp, "b_%s.bin" % dtype)
        with open(ra, "wb") as f:
            f.write(xe.tobytes())
        with open(rb, "wb") as f:
            f.write(ye.tobytes())
        for out in (None, dtype):
            cd = out or "float32"
            for kind, args in (("npy", [pa, pb]), ("raw", ["--dtype", dtype, "--shape", "6x11x4", ra, rb])):
                pc = os.path.join(tmp, "c.%s" % ("npy" if kind == "npy" else "bin"))
                cmd = [GEMM_BIN, "--server", d.base, "multiply"] + args + ["-o", pc] + (["--out-dtype", out] if out else [])
                p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
                name = "gemm multiply %s %s out %s" % (kind, dtype, cd)
                if p.returncode != 0:
                    tap.ok(False, name, p.stdout.decode(errors="replace"))
                    continue
                with open(pc, "rb") as f:
                    data = f.read()
                if kind == "npy":
                    if npy_descr(data) != DESCR[cd]:
                        tap.ok(False, name, "descr %r" % npy_descr(data))
                        continue
                    hl = struct.unpack("<H", data[8:10])[0]
                    data = data[10 + hl:]
                c = from_answer_bytes(data, cd, (6, 4))
                ok, why = close(c, ref, cd, 11)
                tap.ok(ok, name, why)
    p = subprocess.run([GEMM_BIN, "--server", d.base, "multiply", pa, pb, "--out-dtype", "float64"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    tap.ok(p.returncode == 2 and b"out-dtype" in p.stdout, "gemm multiply --out-dtype float64 with bfloat16 is a usage error",
           p.stdout.decode(errors="replace"))


def main(tap):
    with Daemon(tap, config={"backend": "cpu"}) as d:
        products(tap, d)
        batched(tap, d)
        errors(tap, d)
        cli(tap, d)
        d.stop_and_check()


if __name__ == "__main__":
    run_guarded(Tap(), main)
