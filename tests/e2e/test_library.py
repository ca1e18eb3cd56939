#!/usr/bin/env python3
"""test_library.py - what libgemm.so shows a program: its exported symbols, soname and
symbol version, and that its internals cannot be interposed.

The shared library must export exactly the gemm_client_* functions declared in gemm.h and
gemm_util.h (client/lib/libgemm.map), nothing of the HTTP exchange or of the codecs in
common/ it is linked with. The proof that this matters: a program that defines its own
gemm_dtype_name() (a name the library uses inside) still gets right answers.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np  # noqa: F401 - the harness needs it; keeps the test's imports uniform

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import REPO, SLOW, Daemon, Tap, run_guarded  # noqa: E402

LIBDIR = os.environ.get("GEMMD_LIBDIR") or ("build-san/lib" if os.environ.get("SAN") == "1" else "lib")
if not os.path.isabs(LIBDIR):
    LIBDIR = os.path.join(REPO, LIBDIR)
SO = os.path.join(LIBDIR, "libgemm.so")
SAN_FLAGS = ["-fsanitize=address,undefined"] if os.environ.get("SAN") == "1" else []


def declared_functions():
    """gemm_client_* functions declared (not defined inline) in the public headers."""
    names = set()
    for h in ("gemm.h", "gemm_util.h"):
        text = open(os.path.join(REPO, "client", "lib", h)).read()
        for m in re.finditer(r"^(?!static)[A-Za-z_][\w \t\*]*?\b(gemm_client_\w+)\s*\(", text, re.M):
            names.add(m.group(1))
    return names


def map_globals():
    text = open(os.path.join(REPO, "client", "lib", "libgemm.map")).read()
    text = re.sub(r"#.*", "", text)
    glob = re.search(r"global:(.*?)local:", text, re.S).group(1)
    return {s.strip() for s in glob.split(";") if s.strip()}


def exported():
    """(name, version) of every defined dynamic symbol but the version nodes (type A)."""
    out = subprocess.run(["nm", "-D", "--defined-only", SO], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, check=True).stdout.decode()
    syms = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[1] == "A":
            continue
        name, _, version = parts[2].partition("@@")
        syms.append((name, version))
    return syms


def main(tap):
    if not os.path.exists(SO):
        tap.ok(False, "libgemm.so exists at %s (make)" % SO)
        return
    if not shutil.which("nm") or not shutil.which("objdump"):
        for name in ("exports", "soname", "interposition"):
            tap.skip("libgemm.so " + name, "nm/objdump (binutils) not found")
        return

    syms = exported()
    names = {n for n, _ in syms}
    decl = declared_functions()
    tap.ok(len(decl) >= 15, "the public headers declare the gemm_client_* API (%d functions)" % len(decl),
           sorted(decl))
    stray = sorted(n for n in names if not n.startswith("gemm_client_"))
    tap.ok(not stray, "libgemm.so exports only gemm_client_* symbols", stray)
    tap.eq(sorted(names), sorted(decl), "libgemm.so exports exactly the functions of gemm.h and gemm_util.h")
    tap.eq(sorted(map_globals()), sorted(decl), "libgemm.map lists exactly the functions of the headers")
    tap.ok(all(v == "LIBGEMM_1" for _, v in syms), "every exported symbol carries the version LIBGEMM_1",
           [s for s in syms if s[1] != "LIBGEMM_1"])

    dyn = subprocess.run(["objdump", "-p", SO], stdout=subprocess.PIPE, check=True).stdout.decode()
    m = re.search(r"SONAME\s+(\S+)", dyn)
    tap.eq(m.group(1) if m else None, "libgemm.so.1", "soname libgemm.so.1")
    real = os.path.realpath(SO)
    tap.ok(os.path.basename(real) == "libgemm.so.1.0.0" and os.path.islink(os.path.join(LIBDIR, "libgemm.so.1")),
           "libgemm.so -> libgemm.so.1 -> libgemm.so.1.0.0", real)

    # A program with its own gemm_dtype_name(): were the library's internals exported, the
    # dynamic linker would bind the library's own calls to this one, and the request would
    # name a dtype "interposed".
    tmp = tempfile.TemporaryDirectory(prefix="gemm-lib-")
    src = os.path.join(tmp.name, "interpose.c")
    with open(src, "w") as f:
        f.write(r'''
#include <stdio.h>
#include <string.h>
#include <gemm.h>
const char *gemm_dtype_name(gemm_dtype d) { (void)d; return "interposed"; }
int main(int argc, char **argv)
{
    double a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {0};
    gemm_client_options o;
    gemm_client_options_init(&o);
    gemm_client_error err;
    gemm_client *cl = gemm_client_new(argc > 1 ? argv[1] : "", &o, &err);
    if (!cl) { fprintf(stderr, "%s\n", err.message); return 2; }
    gemm_request r = GEMM_REQUEST_INIT;
    r.dtype = GEMM_DTYPE_F64; r.m = r.k = r.n = 2; r.a = a; r.b = b; r.c = c;
    int rc = gemm_client_multiply(cl, &r, NULL, &err);
    gemm_client_free(cl);
    if (rc != 0) { fprintf(stderr, "%s: %s\n", err.code, err.message); return 1; }
    printf("%g %g %g %g\n", c[0], c[1], c[2], c[3]);
    return !(c[0] == 19 && c[1] == 22 && c[2] == 43 && c[3] == 50);
}
''')
    exe = os.path.join(tmp.name, "interpose")
    cp = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", src, "-o", exe,
                         "-I" + os.path.join(REPO, "client", "lib"), "-I" + os.path.join(REPO, "common"),
                         "-L" + LIBDIR, "-lgemm", "-Wl,-rpath," + LIBDIR] + SAN_FLAGS,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if not tap.ok(cp.returncode == 0, "a program defining gemm_dtype_name() links against libgemm.so",
                  cp.stderr.decode()):
        return
    # The progress of a product over several connections ends with its totals, however fast
    # it was: the panels are reported every 20 ms, and a small product is done before that.
    src2, exe2 = os.path.join(tmp.name, "streams.c"), os.path.join(tmp.name, "streams")
    with open(src2, "w") as f:
        f.write(r'''
#include <stdio.h>
#include <stdint.h>
#include <gemm.h>
static int calls;
static uint64_t last[4];
static int progress(void *ctx, uint64_t up, uint64_t up_total, uint64_t down, uint64_t down_total)
{
    (void)ctx;
    calls++;
    if (up_total == 0 && down_total == 0) return 0; /* the resident B's DELETE, after the panels */
    last[0] = up; last[1] = up_total; last[2] = down; last[3] = down_total;
    return 0;
}
int main(int argc, char **argv)
{
    static double a[64 * 32], b[32 * 48], c[64 * 48];
    for (int i = 0; i < 64 * 32; i++) a[i] = i % 7;
    for (int i = 0; i < 32 * 48; i++) b[i] = i % 5;
    gemm_client_options o;
    gemm_client_options_init(&o);
    o.progress = progress;
    gemm_client_error err;
    gemm_client *cl = gemm_client_new(argc > 1 ? argv[1] : "", &o, &err);
    if (!cl) { fprintf(stderr, "%s\n", err.message); return 2; }
    gemm_request r = GEMM_REQUEST_INIT;
    r.dtype = GEMM_DTYPE_F64; r.m = 64; r.k = 32; r.n = 48; r.a = a; r.b = b; r.c = c;
    int rc = gemm_client_multiply_streams(cl, &r, 4, NULL, &err);
    gemm_client_free(cl);
    if (rc != 0) { fprintf(stderr, "%s: %s\n", err.code, err.message); return 1; }
    double want = 0;
    for (int p = 0; p < 32; p++) want += a[63 * 32 + p] * b[p * 48 + 47];
    printf("%d %llu %llu %llu %llu %d\n", calls, (unsigned long long)last[0], (unsigned long long)last[1],
           (unsigned long long)last[2], (unsigned long long)last[3], c[63 * 48 + 47] == want);
    return 0;
}
''')
    cp = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", src2, "-o", exe2,
                         "-I" + os.path.join(REPO, "client", "lib"), "-I" + os.path.join(REPO, "common"),
                         "-L" + LIBDIR, "-lgemm", "-Wl,-rpath," + LIBDIR] + SAN_FLAGS,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tap.ok(cp.returncode == 0, "a program using gemm_client_multiply_streams links", cp.stderr.decode())
    with Daemon(tap, config={"backend": "cpu"}) as d:
        p = subprocess.run([exe, d.base], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60 * SLOW)
        tap.ok(p.returncode == 0 and p.stdout.strip() == b"19 22 43 50",
               "the library's own calls do not bind to the program's gemm_dtype_name()",
               (p.returncode, p.stdout, p.stderr))
        if cp.returncode == 0:
            p = subprocess.run([exe2, d.base], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60 * SLOW)
            f = p.stdout.split()
            # up: A (64x32) and B (32x48) float64; down: C (64x48)
            tap.ok(p.returncode == 0 and len(f) == 6 and int(f[0]) >= 1 and f[1] == f[2] == b"%d" % (8 * (64 * 32 + 32 * 48))
                   and f[3] == f[4] == b"%d" % (8 * 64 * 48) and f[5] == b"1",
                   "a product over 4 connections: C right, and its progress ends at its totals however fast it ran",
                   (p.returncode, p.stdout, p.stderr))
    tmp.cleanup()


if __name__ == "__main__":
    run_guarded(Tap(), main)
