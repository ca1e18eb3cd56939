"""blas_cases.py - what tests/e2e/test_blas.py and test_blas_wheels.py share: where the
preload library and the test programs are, the table of entry points it defines, the
environment a program runs with under the preload, its log lines, calls described as cases
for tests/blas/blas_calls.c and NumPy products (blas_numpy_child.py), with their float64
NumPy reference (computed here, outside the preload). Not a test by itself.

A case's buffers follow BLAS storage: the matrix stored (op(A) or its transpose) laid out
in the call's order with its leading dimension; the padding of A and B is NaN (reading it
would show in C) and the padding of C is 12345, which must come back untouched.
"""

import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import GEMMD_BIN, REPO, SLOW  # noqa: E402

BUILD = os.environ.get("GEMMD_BUILD", "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(REPO, BUILD)
PROGS = os.path.join(BUILD, "tests", "blas")
LIBDIR = os.environ.get("GEMMD_LIBDIR") or os.path.join(os.path.dirname(os.path.dirname(GEMMD_BIN)), "lib")
if not os.path.isabs(LIBDIR):
    LIBDIR = os.path.join(REPO, LIBDIR)
PRELOAD = os.path.join(LIBDIR, "libgemm_blas.so")
SAN = "build-san" in PRELOAD
NETLIB = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3"
RUN_TIMEOUT = 300 * SLOW
START_RE = re.compile(r"^libgemm_blas: (interposes|BLAS in this process:|\S+: host) (.*)$", re.M)
LOG_RE = re.compile(r"^libgemm_blas: (\S+) (\S+) (\S)(\S) m=(-?\d+) n=(-?\d+) k=(-?\d+) -> (server|host|here) "
                    r"([0-9.]+) ms \((.*)\)$")


def flavours():
    """The table of client/blas/blas_internal.h: (cblas s, cblas d, Fortran s, Fortran d,
    integer type) per row of GB_FLAVOURS."""
    with open(os.path.join(REPO, "client", "blas", "blas_internal.h")) as f:
        text = f.read()
    body = text[text.index("#define GB_FLAVOURS(X)"):text.index("#define GB_ENUM")]
    return [tuple(x.strip() for x in row.split(",")) for row in re.findall(r"^\s*X\(([^)]*)\)", body, re.M)]


def map_names():
    """The names client/blas/libgemm_blas.map exports."""
    with open(os.path.join(REPO, "client", "blas", "libgemm_blas.map")) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    glob = text[text.index("global:") + 7:text.index("local:")]
    return sorted(x.strip() for x in glob.split(";") if x.strip())


def start_lines(stderr):
    """{"interposes": [...], "libs": [...], "hosts": {name: line}} from the start lines."""
    out = {"interposes": [], "libs": [], "hosts": {}}
    for kind, rest in START_RE.findall(stderr):
        if kind == "interposes":
            out["interposes"] = rest.split()
        elif kind.startswith("BLAS"):
            out["libs"].append(rest)
        else:
            out["hosts"][kind.split(":")[0]] = rest
    return out


def child_env(server=None, preload=True, **extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("GEMM_")}
    e.pop("LD_PRELOAD", None)
    if preload:
        e["LD_PRELOAD"] = PRELOAD
        if SAN:
            opts = e.get("ASAN_OPTIONS", "")
            e["ASAN_OPTIONS"] = (opts + ":" if opts else "") + "verify_asan_link_order=0"
    if server:
        e["GEMM_SERVER"] = server
    e["GEMM_OFFLOAD_LOG"] = "1"
    e["GEMM_OFFLOAD_LEARN"] = "0"  # where a call runs follows the floors alone; test_learn sets 1
    for k, v in extra.items():
        e[k] = str(v)
    return e


def run(cmd, env):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=RUN_TIMEOUT)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def log_lines(stderr):
    """(entry, order, ta, tb, m, n, k, where, why) for each log line."""
    out = []
    for line in stderr.splitlines():
        mt = LOG_RE.match(line)
        if mt:
            g = mt.groups()
            out.append((g[0], g[1], g[2], g[3], int(g[4]), int(g[5]), int(g[6]), g[7], g[9]))
    return out


def warnings(stderr):
    return [ln for ln in stderr.splitlines() if ln.startswith("libgemm_blas: warning:")]


def sanitizer(text):
    for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
        i = text.find(marker)
        if i >= 0:
            return text[max(0, i - 200):i + 2000]
    return ""


# ---------------------------------------------------------------------------- cases

LP64 = ("cblas_sgemm", "cblas_dgemm", "sgemm_", "dgemm_")


class Case:
    """One call: its arguments, the buffers it gets and the expected C."""

    def __init__(self, entry, order, ta, tb, m, n, k, pads, alpha, beta, null_ab=False):
        self.entry, self.ta, self.tb = entry, ta, tb
        self.order = order if "cblas_" in entry else "C"
        self.m, self.n, self.k = m, n, k
        self.alpha, self.beta, self.null_ab = alpha, beta, null_ab
        self.pads = pads
        self.f32 = "sgemm" in entry
        self.arg_m = None  # passed instead of m (a negative m cannot be stored)

    def dims(self):
        ar, ac = (self.m, self.k) if self.ta == "N" else (self.k, self.m)
        br, bc = (self.k, self.n) if self.tb == "N" else (self.n, self.k)
        return ar, ac, br, bc

    def lds(self):
        ar, ac, br, bc = self.dims()
        row = self.order == "R"
        pa, pb, pc = self.pads
        return (max(1, ac if row else ar) + pa, max(1, bc if row else br) + pb, max(1, self.n if row else self.m) + pc)

    def store_lds(self):
        """Leading dimensions of the buffers: at least a row (column) long even when the
        call passes a smaller, invalid one."""
        ar, ac, br, bc = self.dims()
        row = self.order == "R"
        need = (max(1, ac if row else ar), max(1, bc if row else br), max(1, self.n if row else self.m))
        return tuple(max(x, q) for x, q in zip(self.lds(), need))


def store(mat, order, ld, fill):
    """mat (r x c) into a flat buffer with leading dimension ld; padding = fill."""
    r, c = mat.shape
    nlines = r if order == "R" else c
    buf = np.full(max(1, nlines * ld), fill, dtype=np.float64)
    if r and c:
        view = buf[:nlines * ld].reshape(nlines, ld)
        if order == "R":
            view[:, :c] = mat
        else:
            view[:, :r] = mat.T
    return buf


def logical(buf, order, ld, r, c):
    if r == 0 or c == 0:
        return np.zeros((r, c))
    nlines = r if order == "R" else c
    view = buf[:nlines * ld].reshape(nlines, ld)
    return view[:, :c].copy() if order == "R" else view[:, :r].T.copy()


def f32(x):
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def write_cases(tmp, cases, rng):
    """Writes the case file and data for blas_calls; returns paths and per-case layout."""
    chunks, layout, lines, off = [], [], [], 0
    for cs in cases:
        ar, ac, br, bc = cs.dims()
        lda, ldb, ldc = cs.lds()
        sla, slb, slc = cs.store_lds()
        sa = f32(rng.uniform(-1, 1, (ar, ac)))
        sb = f32(rng.uniform(-1, 1, (br, bc)))
        c0 = f32(rng.uniform(-1, 1, (cs.m, cs.n)))
        if cs.beta == 0 and c0.size:
            c0[rng.random(c0.shape) < 0.5] = np.nan
            c0[rng.random(c0.shape) < 0.2] = np.inf
        # A and B padding is NaN: reading it would show in C; C padding must stay 12345.
        ba = store(sa, cs.order, sla, np.nan)
        bb = store(sb, cs.order, slb, np.nan)
        bc_ = store(c0, cs.order, slc, 12345.0)
        lay = {}
        for name, buf in (("a", ba), ("b", bb), ("c", bc_)):
            lay[name] = (off, len(buf))
            chunks.append(buf)
            off += len(buf)
        layout.append((sa, sb, c0, lay))
        lines.append("%s %s %s %s %d %d %d %d %d %d %r %r %d %d %d %d %d %d %d" % (
            cs.entry, cs.order, cs.ta, cs.tb, cs.m if cs.arg_m is None else cs.arg_m, cs.n, cs.k, lda, ldb, ldc, cs.alpha, cs.beta,
            1 if cs.null_ab else 0, lay["a"][0], lay["a"][1], lay["b"][0], lay["b"][1],
            lay["c"][0], lay["c"][1]))
    data = np.concatenate(chunks) if chunks else np.zeros(1)
    cpath, dpath, opath = (os.path.join(tmp, x) for x in ("cases.txt", "data.bin", "out.bin"))
    with open(cpath, "w") as f:
        f.write("\n".join(lines) + "\n")
    data.astype("<f8").tofile(dpath)
    return cpath, dpath, opath, layout, data


def expected(cs, sa, sb, c0):
    a = sa if cs.ta == "N" else sa.T
    b = sb if cs.tb == "N" else sb.T
    prod = a @ b if cs.k else np.zeros((cs.m, cs.n))
    e = np.zeros((cs.m, cs.n)) if cs.alpha == 0 else cs.alpha * prod
    bound = np.abs(cs.alpha) * (np.abs(a) @ np.abs(b) if cs.k else np.zeros((cs.m, cs.n)))
    if cs.beta != 0:
        e = e + cs.beta * c0
        bound = bound + np.abs(cs.beta * c0)
    return e, bound


def check_results(cs, layout, out):
    """(ok, detail) for one case: C within tolerance, padding of C untouched."""
    sa, sb, c0, lay = layout
    off, n = lay["c"]
    buf = out[off:off + n]
    ldc = cs.store_lds()[2]
    got = logical(buf, cs.order, ldc, cs.m, cs.n)
    want, bound = expected(cs, sa, sb, c0)
    eps = np.finfo(np.float32 if cs.f32 else np.float64).eps
    tol = 4 * (cs.k + 2) * eps * bound + 1e-30
    err = np.abs(got - want)
    if got.size and not np.all(err <= tol):
        i = np.unravel_index(np.argmax(np.where(err <= tol, 0, err + 1)), err.shape)
        return False, "C%r = %r, want %r (tol %g)" % (tuple(int(x) for x in i), got[i], want[i], tol[i])
    mask = np.ones(len(buf), dtype=bool)
    if cs.m and cs.n:
        nlines = cs.m if cs.order == "R" else cs.n
        width = cs.n if cs.order == "R" else cs.m
        mask[:nlines * ldc].reshape(nlines, ldc)[:, :width] = False
    if not np.all(buf[mask] == 12345.0):
        return False, "padding of C was written"
    return True, ""


def random_cases(rng, count, dims=(1, 2, 3, 7, 16, 33, 64, 100, 129), entries=LP64):
    """count calls spread over the entries (a flavour's four names, say), then
    the quick returns of each."""
    cases = []
    for i in range(count):
        entry = entries[i % 4]
        order = "RC"[rng.integers(2)]
        ta, tb = "NTC"[rng.integers(3)], "NTC"[rng.integers(3)]
        m, n, k = (int(rng.choice(dims)) for _ in range(3))
        pads = tuple(int(x) for x in rng.choice([0, 0, 1, 3], 3))
        alpha = float(rng.choice([1.0, -0.5, 2.0, 0.75]))
        beta = float(rng.choice([0.0, 1.0, -1.5, 0.5]))
        cases.append(Case(entry, order, ta, tb, m, n, k, pads, alpha, beta))
    # quick returns and alpha = 0 (A and B not read: NULL pointers), beta = 0 over NaN
    for entry in entries:
        cases.append(Case(entry, "R", "N", "N", 0, 5, 4, (0, 0, 0), 1.0, 0.0))
        cases.append(Case(entry, "C", "T", "N", 6, 0, 4, (1, 0, 0), 1.0, 0.5))
        cases.append(Case(entry, "C", "N", "T", 6, 5, 0, (0, 0, 1), 1.0, 0.0))
        cases.append(Case(entry, "R", "T", "T", 6, 5, 0, (0, 0, 1), 1.0, -2.0))
        cases.append(Case(entry, "R", "N", "N", 9, 8, 7, (0, 2, 1), 0.0, 0.0, null_ab=True))
        cases.append(Case(entry, "C", "N", "N", 9, 8, 7, (0, 2, 1), 0.0, 2.5, null_ab=True))
    return cases


def offloadable(cs):
    return cs.m > 0 and cs.n > 0 and cs.k > 0 and cs.alpha != 0


def run_calls(tap, label, cases, env, rng, want_where=None):
    """Runs blas_calls on the cases; checks every C and, when want_where is given (a
    function case -> "server"/"host"/None), where each call ran. Returns the stderr."""
    with tempfile.TemporaryDirectory(prefix="gemm-blas-") as tmp:
        cpath, dpath, opath, layout, _ = write_cases(tmp, cases, rng)
        rc, out, err = run([os.path.join(PROGS, "blas_calls"), cpath, dpath, opath], env)
        if not tap.ok(rc == 0, "%s: blas_calls ran %d calls" % (label, len(cases)),
                      "exit %d\nstdout %s\nstderr %s" % (rc, out, err[-3000:])):
            return err
        res = np.fromfile(opath, dtype="<f8")
    bad = []
    for i, (cs, lay) in enumerate(zip(cases, layout)):
        ok, why = check_results(cs, lay, res)
        if not ok:
            bad.append("case %d %s %s %s%s m=%d n=%d k=%d lds=%r alpha=%g beta=%g: %s" % (
                i, cs.entry, cs.order, cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.lds(), cs.alpha, cs.beta, why))
    by_entry = {}
    for cs in cases:
        by_entry[cs.entry] = by_entry.get(cs.entry, 0) + 1
    tap.ok(not bad, "%s: every C right (%s), padding untouched" % (
        label, ", ".join("%d %s" % (v, k) for k, v in sorted(by_entry.items()))), "\n".join(bad[:10]))
    logs = log_lines(err)
    if want_where is not None:
        wrong = []
        if len(logs) != len(cases):
            wrong.append("%d log lines for %d calls" % (len(logs), len(cases)))
        for i, (cs, lg) in enumerate(zip(cases, logs)):
            want = want_where(cs)
            if lg[0] != cs.entry or (lg[4], lg[5], lg[6]) != (cs.m, cs.n, cs.k):
                wrong.append("case %d logged as %r" % (i, lg))
            elif want is not None and lg[7] != want:
                wrong.append("case %d %s m=%d n=%d k=%d alpha=%g ran on the %s (%s), want %s" % (
                    i, cs.entry, cs.m, cs.n, cs.k, cs.alpha, lg[7], lg[8], want))
        tap.ok(not wrong, "%s: each call logged once, where it should run" % label, "\n".join(wrong[:10]))
    san = sanitizer(err)
    tap.ok(not san, "%s: no sanitizer report" % label, san)
    return err


def run_invalid(tap, label, base, rng, entries, **extra):
    """Bad arguments reach the host BLAS unchanged: the same messages as without the
    preload, C untouched, never offloaded."""
    cases = []
    for entry in entries:
        cases.append(Case(entry, "R", "N", "N", 20, 20, 20, (-1, 0, 0), 1.0, 0.0))   # lda
        cases.append(Case(entry, "C", "N", "T", 20, 20, 20, (0, -1, 0), 1.0, 0.0))   # ldb
        cases.append(Case(entry, "C", "T", "N", 20, 20, 20, (0, 0, -1), 1.0, 1.0))   # ldc
        cases.append(Case(entry, "R", "X", "N", 20, 20, 20, (0, 0, 0), 1.0, 0.0))    # trans
        cases.append(Case(entry, "C", "N", "N", 0, 20, 20, (0, 0, 0), 1.0, 0.0))     # m < 0
        cases[-1].arg_m = -1
    with tempfile.TemporaryDirectory(prefix="gemm-blas-") as tmp:
        cpath, dpath, opath, layout, data = write_cases(tmp, cases, rng)
        prog = [os.path.join(PROGS, "blas_calls"), cpath, dpath, opath]
        rc0, so0, err0 = run(prog, child_env(preload=False, **extra))
        out0 = np.fromfile(opath, dtype="<f8") if rc0 == 0 else None
        env = child_env(base, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0, **extra)
        rc1, so1, err1 = run(prog, env)
        out1 = np.fromfile(opath, dtype="<f8") if rc1 == 0 else None
    # OpenBLAS's xerbla prints on stdout, netlib's on stderr: take both
    host_msgs = [ln for ln in (so0 + err0).splitlines() if ln.strip() and not ln.startswith("calls ")]
    ours = [ln for ln in (so1 + err1).splitlines()
            if ln.strip() and not ln.startswith("libgemm_blas:") and not ln.startswith("calls ")]
    tap.ok(rc0 == 0 and rc1 == 0, "%s: the program goes on, with and without the preload" % label,
           "rc %r %r\n%s\n%s" % (rc0, rc1, err0[-2000:], err1[-2000:]))
    tap.ok(len(host_msgs) == len(cases) and ours == host_msgs,
           "%s: the host BLAS reports each one, the same with the preload (%d messages)" % (label, len(host_msgs)),
           "without:\n%s\nwith:\n%s" % ("\n".join(host_msgs), "\n".join(ours)))
    tap.ok(out0 is not None and out1 is not None and np.array_equal(out0, data, equal_nan=True)
           and np.array_equal(out1, data, equal_nan=True), "%s: C untouched" % label)
    logs = log_lines(err1)
    tap.ok(len(logs) == len(cases) and all(lg[7] == "host" and lg[8] == "invalid arguments" for lg in logs),
           "%s: never offloaded, logged as such" % label, logs[:6])


# ---------------------------------------------------------------------------- NumPy

def numpy_pairs(rng, shapes=((150, 130, 170), (64, 300, 90), (257, 129, 65))):
    """Operand pairs a<i>, b<i> for blas_numpy_child.py: each shape in float32 and float64."""
    data, i = {}, 0
    for dt in (np.float32, np.float64):
        for (m, k, n) in shapes:
            data["a%d" % i] = rng.uniform(-1, 1, (m, k)).astype(dt)
            data["b%d" % i] = rng.uniform(-1, 1, (k, n)).astype(dt)
            i += 1
    return data


def numpy_wrong(data, res, keys="ctfsgh"):
    """The products of blas_numpy_child.py that are missing or wrong (float64 reference);
    g and h (SciPy) only when the child computed them."""
    bad, j = [], 0
    while "a%d" % j in data:
        a, b = data["a%d" % j], data["b%d" % j]
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        k2 = b.shape[0] // 2 * 2
        refs = {"c": a64 @ b64, "t": a64 @ b64, "f": a64 @ b64, "s": a64[::2, :k2:2] @ b64[:k2:2, ::2],
                "g": a64 @ b64, "h": 2 * (a64 @ b64)}
        eps = np.finfo(a.dtype).eps
        tol = 8 * (a.shape[1] + 2) * eps * (np.abs(a64) @ np.abs(b64)).max() + 1e-30
        for key in keys:
            got = res.get("%s%d" % (key, j))
            if got is None and key in "gh" and "g0" not in res:
                continue
            ref = refs[key]
            if got is None or got.shape != ref.shape or got.dtype != a.dtype or not np.all(np.abs(got - ref) <= tol):
                bad.append("%s%d %s" % (key, j, "missing" if got is None else got.shape))
        j += 1
    return bad
