#!/usr/bin/env python3
"""test_docs.py - every example of README.md and docs/*.md, run the way a new user would.

Which fenced blocks are examples is decided by the fence's language:
  - ```sh, ```console, ```python and ```c are examples. Each one is run here, or listed in
    NOT_RUN with the reason it cannot run on a test machine (a container engine, systemd, a
    Kubernetes cluster, ...). Nothing else is needed: a new block is run by default (its
    check is then that it exits 0), so a new example cannot go untested.
  - ```json, ```http, ```text and blocks without a language show requests, answers,
    headers, logs, layouts or synopses: they are not run. A block without a language whose
    first line is a command (curl, gemm, make, ...) fails: label it sh (or console).

How they run:
  - Against the real daemon on a free loopback port: the CPU backend, or where
    `nvidia-smi -L` lists a GPU, the backend `auto` (CUDA in a CUDA build). The examples'
    server names, localhost:8080 and gpu-box:8080, become 127.0.0.1:<that port>, and
    GEMM_SERVER is set to it, as a reader would have it.
  - The blocks of one document run in order, in one folder of their own, as in a reader's
    shell (README's `gemm` examples use the files its curl examples made), with the build's
    bin/ and lib/ linked in as bin and lib, the build's bin/ and this Python (it has NumPy)
    first in PATH, and client/python/src in PYTHONPATH. curl runs with --fail-with-body: a
    request of an example that gets an error answer fails its block. Files the document
    expects the reader to have (the inputs of CLIENT.md's `gemm multiply` lines, prog.c,
    ...) are written first (SPECS: given).
  - sh blocks run with bash -euo pipefail; console blocks run each `$ ` line and compare
    what it prints with the lines shown after it (JSON: the same keys, recursively; text:
    the same `key:` lines, in order; `...` stands for anything); python blocks run with
    this Python (those importing tritonclient with build/venv's); c blocks are built with
    the documented pkg-config line plus -Wall -Wextra -Werror, and run.
  - GPU only: a block whose first line is a comment saying "GPU only", or in sh and python
    blocks a group of lines (between blank lines) whose first comment says so, is left out
    without a GPU (the TAP line says so) and run with one.
  - Lines that set up what `make test` has set up before this program runs (`make`,
    `pip install numpy`) are listed in SETUP and not run again; the block's TAP line names
    the ones it left out.
  - What a block says it produces is checked (SPECS: check): files it writes against
    NumPy, answers its comments show, exit codes, output.
  - Under the sanitizer build (SAN=1) blocks that link or preload the normal build's lib/
    are skipped, saying so.

The JSON of README.md and API.md is checked against the daemon: requests shown are answered
200, answers shown have the fields of a real one, errors shown are the daemon's word for
word (V2.md's JSON: tests/e2e/test_v2.py).

Also: every curl in a block that writes its answer to a file uses --fail-with-body; every
block that uses $ID sets it first; every example naming a kernel the CPU backend lacks is
GPU only; API.md's raw request has the right Content-Length and the daemon takes it; the
build lines in docs/examples/multiply.c's header work; the Dockerfile's stages (CPU and GPU,
base images as build arguments) install what scripts/deps.sh names and no curl, run as a
numeric non-root user with the shipped config, and their HEALTHCHECK command (gemm health)
passes against a live daemon and fails against none (make container-test builds and runs
the CPU image).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import REPO, SLOW, Daemon, Tap, free_port, raw_request, run_guarded  # noqa: E402

GEMM_BIN = os.environ.get("GEMM_BIN", "bin/gemm")
if not os.path.isabs(GEMM_BIN):
    GEMM_BIN = os.path.join(REPO, GEMM_BIN)
LIBDIR = os.path.join(REPO, os.environ.get("GEMMD_LIBDIR", "lib"))
SAN = os.environ.get("SAN") == "1"
DOCS = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(REPO, "docs")) if f.endswith(".md"))
RUNNABLE = ("sh", "console", "python", "c")
CPU_KERNELS = {"auto", "openblas", "blocked"}
VENV = os.path.join(REPO, "build", "venv")  # tritonclient[http], as tests/e2e/test_v2.py makes it

# Blocks not run here, by (document, text that only that block of the document holds): why.
NOT_RUN = {
    ("README.md", "make run"):
        "starts the daemon in the foreground, and make test is what runs this program",
    ("README.md", "pip install client/python"):
        "tests/e2e/test_python.py installs the package with pip in a virtual environment and runs "
        "its tests; the Python blocks here use the same package from client/python/src",
    ("README.md", "make uninstall"):
        "installs into the system; tests/e2e/test_install.py runs make install and make uninstall "
        "with a DESTDIR and uses what they installed",
    ("README.md", "systemctl enable"):
        "needs systemd as the init system; tests/e2e/test_install.py checks the installed unit "
        "with systemd-analyze verify",
    ("README.md", "nvidia-ctk runtime configure"):
        "needs Docker and a GPU host with the NVIDIA Container Toolkit; the Dockerfile is checked below, "
        "`CONTAINER_CUDA=1 make container-test` builds the GPU image with podman",
    ("README.md", "nvidia-ctk cdi generate"):
        "needs a GPU host with the NVIDIA Container Toolkit's CDI spec; `CONTAINER_CUDA=1 make "
        "container-test` builds the GPU image with podman",
    ("README.md", "--target cpu -t gemmd:cpu"):
        "builds an image (minutes): `make container-test` builds and runs the CPU image with podman",
    ("README.md", "-v $PWD/my.conf"):
        "needs a GPU host; `make container-test` runs the CPU image with a mounted config and tokens file",
    ("docs/OPERATIONS.md", "helm install"):
        "needs a Kubernetes cluster with Prometheus and helm; tests/e2e/test_k8s.py validates the "
        "manifests of deploy/k8s",
}

# Lines that set up what make test has set up already: not run again.
SETUP = {
    "make": "built before the tests run",
    "pip install numpy": "this Python has NumPy",
    "pip install numpy scipy": "this Python has NumPy (the block needs nothing more); "
                               "tests/e2e/test_blas_wheels.py installs both from PyPI",
}


class Ctx:
    """What a check sees: the folder, the block's output, the daemon, whether a GPU ran it."""

    def __init__(self, dir, out, err, d, gpu):
        self.dir, self.out, self.err, self.d, self.gpu = dir, out, err, d, gpu

    def path(self, name):
        return os.path.join(self.dir, name)

    def npy(self, name):
        return np.load(self.path(name))

    def raw(self, name, dtype, shape):
        return np.fromfile(self.path(name), dtype=dtype).reshape(shape)


def close(got, want, rtol=1e-6, atol=1e-9):
    got, want = np.asarray(got), np.asarray(want)
    return got.shape == want.shape and np.allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)


def f64(*arrays):
    out = [np.asarray(a, dtype=np.float64) for a in arrays]
    return out if len(out) > 1 else out[0]


# ---------------------------------------------------------------------------- checks

def check_readme_curl(c):
    A, B = f64(c.npy("A.npy"), c.npy("B.npy"))
    a32 = c.raw("A.bin", "<f4", (1024, 1024))
    b32 = c.raw("B.bin", "<f4", (1024, 1024))
    out = [
        (close(c.npy("C.npy"), A @ B), "its C.npy (the async example's) is A.B (NumPy)", None),
        (close(c.raw("C.bin", "<f4", (1024, 1024)), f64(a32) @ f64(b32), rtol=1e-4, atol=1e-3),
         "its C.bin (raw float32) is A.B", None),
        ('"c":[[19,22],[43,50]]' in c.out and '"c":[[14],[32]]' in c.out,
         "its JSON examples answer what the comment shows", c.out[:600]),
        (re.search(r"(?im)^X-Gemm-Shape: 1024,1024\r?$", c.out)
         and re.search(r"(?im)^X-Gemm-Dtype: float32\r?$", c.out),
         "the raw example's headers (-D -) are the ones its comment shows", c.out[:2000]),
        ((c.d.curl("GET", "/readyz").json() or {}).get("queued") == 0, "the async example leaves no job queued", None),
        (stages(c.out) and stages(c.out) == stages(read("README.md")),
         "its Server-Timing has the stages its comment shows",
         (stages(c.out), stages(read("README.md")))),
    ]
    if c.gpu:
        A32, B32 = f64(c.npy("A32.npy"), c.npy("B32.npy"))
        out.append((close(c.npy("C32.npy"), A32 @ B32, rtol=1e-2, atol=1e-2), "GPU: its tf32 C32.npy is A.B", None))
    return out


def stages(text):
    """The stage names of the first Server-Timing line in text."""
    m = re.search(r"(?im)^(?:# )?Server-Timing: (.*)$", text)
    return [e.split(";")[0].strip() for e in m.group(1).split(", ")] if m else []


def check_readme_gemm(c):
    A, B = f64(c.npy("A.npy"), c.npy("B.npy"))
    a32 = c.raw("A.bin", "<f4", (1024, 1024))
    b32 = c.raw("B.bin", "<f4", (1024, 1024))
    return [
        (close(c.npy("C.npy"), A @ B), "gemm multiply A.npy B.npy wrote A.B to C.npy", None),
        (close(c.raw("C.bin", "<f4", (1024, 1024)), f64(a32) @ f64(b32), rtol=1e-4, atol=1e-3),
         "gemm multiply A.bin B.bin --shape 1024x1024 wrote A.B to C.bin", None),
        (close(np.loadtxt(c.path("C.csv"), delimiter=",", ndmin=2), A @ B),
         "gemm multiply ... -o C.csv wrote A.B as text", None),
        ("server total" in c.err, "--timing printed the server's stages", c.err[-1500:]),
        ("requests/s" in c.out and "1024x1024x1024" in c.out, "gemm bench printed its measurements", c.out[-1500:]),
    ]


def check_cc(c):
    runs = c.out.count("kernel ")
    return [(runs >= 1, "each program built ran and printed its kernel", c.out[-1500:])]


def check_blas(c):
    lines = [ln for ln in c.err.splitlines() if ln.startswith("libgemm_blas:")]
    return [
        (any(ln.startswith("libgemm_blas: interposes ") for ln in lines), "GEMM_OFFLOAD_LOG=1 names the entry points",
         c.err[-2000:]),
        (any(re.search(r"dgemm\S* .*m=2000 n=2000 k=2000 -> server", ln) for ln in lines),
         "the 2000x2000 product went to the server", c.err[-2000:]),
        (re.fullmatch(r"\s*[0-9.e+]+\s*", c.out) is not None, "the program printed its sum", c.out[-300:]),
    ]


def check_v2_curl(c):
    return [('"outputs":[{"name":"C","datatype":"FP64","shape":[1,1],"data":[11]}]' in c.out,
             "the infer example answers what its comment shows", c.out[-800:])]


def check_api_raw(c):
    a = np.fromfile(c.path("A.bin"), "<f4").reshape(2, 3)
    b = np.fromfile(c.path("B.bin"), "<f4").reshape(3, 2)
    return [(close(c.raw("C.bin", "<f4", (2, 2)), f64(a) @ f64(b)), "C.bin is A.B", None)]


def check_api_batch(c):
    ab = np.fromfile(c.path("AB.bin"), "<f4")
    a = ab[:1000 * 64 * 64].reshape(1000, 64, 64)
    b = ab[1000 * 64 * 64:].reshape(64, 64)
    return [(close(c.raw("C.bin", "<f4", (1000, 64, 64)), f64(a) @ f64(b), rtol=1e-5, atol=1e-4),
             "C.bin holds the 1000 products A[i].B", None)]


def check_client_c(c):
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    b = (1.0 / (np.arange(8) + 1)).reshape(4, 2)
    m = re.search(r"c\[0\]\[0\] = (\S+); kernel \S+", c.out)
    return [(m is not None and abs(float(m.group(1)) - (a @ b)[0, 0]) < 1e-5,
             "it prints C[0][0] = A.B's and the kernel", c.out[-500:])]


def check_client_multiply(c):
    A, B = f64(c.npy("A.npy"), c.npy("B.npy"))
    a32 = c.raw("A.bin", "<f4", (1024, 512))
    b32 = c.raw("B.bin", "<f4", (512, 256))
    ai = np.loadtxt(c.path("A.csv"), delimiter=",", dtype=np.int64, ndmin=2)
    bi = np.loadtxt(c.path("B.tsv"), delimiter="\t", dtype=np.int64, ndmin=2)
    As, Bs = f64(c.npy("As.npy"), c.npy("Bs.npy"))
    return [
        (close(c.npy("C.npy"), A @ B), "C.npy is A.B", None),
        (close(c.raw("C.bin", "<f4", (1024, 256)), f64(a32) @ f64(b32), rtol=1e-4, atol=1e-3),
         "--shape 1024x512: C.bin is A.B (1024x256)", None),
        (np.array_equal(np.loadtxt(c.path("C.csv"), delimiter=",", dtype=np.int64, ndmin=2), ai @ bi),
         "int32 text: C.csv is A.B exactly", None),
        (close(c.npy("big_C.npy"), f64(c.npy("big_A.npy")) @ f64(c.npy("big_B.npy")), rtol=1e-4, atol=1e-3),
         "--async: big_C.npy is A.B", None),
        (close(c.npy("Cs.npy"), As @ Bs), "3-D: Cs.npy is the batch of products", None),
        (c.err.count("server total") >= 1, "gemm -s gpu-box:8080 (host:port) reached the server and printed --timing",
         c.err[-1500:]),
    ]


def check_client_bench(c):
    return [(c.out.count("requests/s") == 2 and "4096x256x4096" in c.out, "both benchmarks printed their measurements",
             c.out[-1500:])]


def given_client_multiply(d):
    rng = np.random.default_rng(7)
    np.save(os.path.join(d, "A.npy"), rng.random((60, 40)))
    np.save(os.path.join(d, "B.npy"), rng.random((40, 30)))
    rng.random((1024, 512), np.float32).tofile(os.path.join(d, "A.bin"))
    rng.random((512, 256), np.float32).tofile(os.path.join(d, "B.bin"))
    np.savetxt(os.path.join(d, "A.csv"), rng.integers(-50, 50, (5, 4)), fmt="%d", delimiter=",")
    np.savetxt(os.path.join(d, "B.tsv"), rng.integers(-50, 50, (4, 3)), fmt="%d", delimiter="\t")
    np.save(os.path.join(d, "big_A.npy"), rng.random((300, 200), np.float32))
    np.save(os.path.join(d, "big_B.npy"), rng.random((200, 100), np.float32))
    np.save(os.path.join(d, "As.npy"), rng.random((4, 30, 20)))
    np.save(os.path.join(d, "Bs.npy"), rng.random((20, 10)))


def given_api_raw(d):
    np.arange(1, 7, dtype="<f4").tofile(os.path.join(d, "A.bin"))  # 24 bytes each, as the text says
    np.arange(-3, 3, dtype="<f4").tofile(os.path.join(d, "B.bin"))


def given_api_batch(d):
    rng = np.random.default_rng(5)
    rng.random(1000 * 64 * 64 + 64 * 64, np.float32).tofile(os.path.join(d, "AB.bin"))


def given_prog_c(d):
    shutil.copy(os.path.join(REPO, "docs", "examples", "multiply.c"), os.path.join(d, "prog.c"))


README_PY_CHECK = r'''
import os
GPU = os.environ.get("GEMM_DOCS_GPU") == "1"
ref = a @ b
assert np.allclose(c, ref), "c (the queued job's) is not A.B"
h = a16.astype(np.float64) @ b16.astype(np.float64)
assert c16.dtype == np.float16 and np.allclose(c16.astype(np.float64), h, rtol=1e-2, atol=0.1), "c16"
assert np.allclose(p.c, ref) and p.kernel and p.device, ("product", p.kernel, p.device)
assert cs.shape == (2, 512, 128) and np.allclose(cs[1], 2 * ref), "the batch"
if GPU:
    assert p32.math == "tf32" and np.allclose(p32.c, ref, rtol=1e-2, atol=1e-2), ("tf32", p32.math)
print("checked")
'''

TRITON_CHECK = r'''
r = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
assert c.shape == r.shape and np.allclose(c, r, rtol=1e-3, atol=1e-2), "C is not A.B"
print("checked")
'''

# How blocks run, by (document, text that only that block holds): files given first, files removed
# first (so that what the block writes is its own), a command run after each of its
# commands, a check (a function of Ctx for sh, console and c; code run after a python
# block), whether it needs the normal build's lib/.
SPECS = {
    ("README.md", "# Inputs to try"): dict(check=check_readme_curl),
    ("README.md", "bin/gemm health"): dict(fresh=["C.npy", "C.bin", "C.csv"], check=check_readme_gemm),
    ("README.md", "cc prog.c"): dict(given=given_prog_c, each="./prog", check=check_cc, lib=True),
    ("README.md", "gemmd.Client()"): dict(post=README_PY_CHECK),
    ("README.md", "GEMM_OFFLOAD_LOG=1"): dict(check=check_blas, lib=True),
    ("README.md", "/v2/models/matmul/infer"): dict(check=check_v2_curl),
    ("README.md", "tritonclient.http"): dict(post=TRITON_CHECK),
    ("docs/API.md", "cat A.bin B.bin"): dict(given=given_api_raw, check=check_api_raw),
    ("docs/API.md", "batch=1000"): dict(given=given_api_batch, check=check_api_batch),
    ("docs/BLAS.md", "GEMM_OFFLOAD_LOG=1"): dict(check=check_blas, lib=True),
    ("docs/CLIENT.md", "cc prog.c"): dict(given=given_prog_c, each="./prog", check=check_cc, lib=True),
    ("docs/CLIENT.md", "gemm_client_new("): dict(check=check_client_c, lib=True),
    ("docs/CLIENT.md", "gemm multiply A.npy"): dict(given=given_client_multiply, check=check_client_multiply),
    ("docs/CLIENT.md", "gemm bench"): dict(check=check_client_bench),
    ("docs/V2.md", "tritonclient.http"): dict(post=TRITON_CHECK),
}


# ---------------------------------------------------------------------------- blocks

class Block:
    def __init__(self, doc, line, lang, body):
        self.doc, self.line, self.lang, self.body = doc, line, lang, body
        self.first = next((ln.strip() for ln in body.splitlines() if ln.strip()), "")

    @property
    def name(self):
        return "%s:%d (%s)" % (self.doc, self.line, self.lang or "no language")

    def key_of(self, table):
        """The keys of table, (doc, text), that this block matches (its text holds theirs)."""
        return [k for k in table if k[0] == self.doc and k[1] in self.body]


def read(path):
    with open(os.path.join(REPO, path)) as f:
        return f.read()


FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)


def blocks(doc):
    """Every fenced block of doc, in order (indented ones, in lists, included, dedented)."""
    text = read(doc)
    out = []
    for m in FENCE.finditer(text):
        ind = len(m.group(1))
        body = "".join(ln[ind:] if ln[:ind].strip() == "" else ln for ln in m.group(3).splitlines(True))
        out.append(Block(doc, text.count("\n", 0, m.start()) + 1, m.group(2), body))
    return out


def commands(body):
    """Shell commands of a block: continuation lines joined, comments and blanks dropped."""
    cmds, cur = [], ""
    for line in body.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            cmds.append(cur.strip())
            cur = ""
    return cmds


def gpu_only(text):
    first = text.lstrip("\n").split("\n", 1)[0].strip()
    return first.startswith("#") and "GPU only" in first


def groups(body):
    """The block as groups of lines between blank lines: [(GPU only?, text)]."""
    out = []
    for g in re.split(r"\n[ \t]*\n", body):
        first_comment = next((ln for ln in g.splitlines() if ln.lstrip().startswith("#")), "")
        out.append(("GPU only" in first_comment, g))
    return out


def wrappers(tmp):
    """A folder to put first on PATH: its python3 is this one (it has NumPy), and its curl
    is curl with --fail-with-body, so that an example's request that gets an error answer
    fails its block even where the example does not ask curl to fail."""
    d = os.path.join(tmp, "wrap")
    os.makedirs(d, exist_ok=True)
    # Wrappers, not symlinks: a virtual environment's python found through a link in
    # another folder no longer sees its environment (nor its NumPy).
    q = lambda p: "'%s'" % p.replace("'", "'\\''")  # noqa: E731
    scripts = {
        "python3": "exec %s \"$@\"\n" % q(sys.executable),
        "curl": 'for a in "$@"; do case "$a" in -f|--fail|--fail-with-body) exec %s "$@";; esac; done\n'
                'exec %s --fail-with-body "$@"\n' % (q(shutil.which("curl")), q(shutil.which("curl"))),
    }
    for name, body in scripts.items():
        with open(os.path.join(d, name), "w") as f:
            f.write("#!/bin/sh\n" + body)
        os.chmod(os.path.join(d, name), 0o755)
    return d


def same_keys(want, got):
    """got has the keys want shows, recursively (lists: their first items)."""
    if isinstance(want, dict):
        return isinstance(got, dict) and set(want) == set(got) and all(same_keys(want[k], got[k]) for k in want)
    if isinstance(want, list) and want and isinstance(want[0], (dict, list)):
        return isinstance(got, list) and len(got) > 0 and same_keys(want[0], got[0])
    return True


def key_lines_in_order(want, got):
    """The `key:` lines shown (with their indentation and "- ") appear in got, in order."""
    keys = [ln.split(":", 1)[0] + ":" for ln in want.splitlines() if ln.strip() and ln.strip() != "..."]
    it = iter(got.splitlines())
    missing = [k for k in keys if not any(ln.startswith(k) for ln in it)]
    return not missing, missing


# ---------------------------------------------------------------------------- runner

class Runner:
    def __init__(self, tap, d, gpu, tmp):
        self.tap, self.d, self.gpu, self.tmp = tap, d, gpu, tmp
        self.host = "127.0.0.1:%d" % d.port
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("GEMM_OFFLOAD", "GEMMD_")) and k not in ("GEMM_TOKEN", "LD_PRELOAD")}
        self.env.update(GEMM_SERVER=d.base, GEMM_DOCS_GPU="1" if gpu else "0",
                        PATH=os.pathsep.join([wrappers(tmp), os.path.dirname(GEMM_BIN), os.environ.get("PATH", "")]),
                        PYTHONPATH=os.path.join(REPO, "client", "python", "src"))
        self.run_count = self.san_count = 0
        self.venv_py = None

    def folder(self, doc):
        d = os.path.join(self.tmp, re.sub(r"\W", "_", doc))
        if not os.path.isdir(d):
            os.makedirs(d)
            os.symlink(os.path.dirname(GEMM_BIN), os.path.join(d, "bin"))
            os.symlink(LIBDIR, os.path.join(d, "lib"))
        return d

    def subst(self, text):
        return text.replace("localhost:8080", self.host).replace("gpu-box:8080", self.host)

    def sh(self, script, cwd, timeout=300):
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=self.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout * SLOW)
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")

    # ---- one block

    def run(self, b):
        tap = self.tap
        if b.key_of(NOT_RUN):
            tap.skip("%s: not run" % b.name, NOT_RUN[b.key_of(NOT_RUN)[0]])
            return
        if gpu_only(b.body) and not self.gpu:
            tap.skip("%s runs" % b.name, "GPU only, and the daemon has no GPU")
            return
        keys = b.key_of(SPECS)
        spec = SPECS[keys[0]] if keys else {}
        if spec.get("lib") and SAN:
            self.san_count += 1
            tap.skip("%s runs" % b.name, "it links or preloads the normal build's lib/ (make test runs it)")
            return
        cwd = self.folder(b.doc)
        if spec.get("given"):
            spec["given"](cwd)
        for f in spec.get("fresh", []):
            if os.path.exists(os.path.join(cwd, f)):
                os.unlink(os.path.join(cwd, f))
        self.run_count += 1
        getattr(self, "run_" + b.lang)(b, spec, cwd)

    def text_of(self, b):
        """The block's text to run: GPU-only groups out without a GPU, setup lines out. Returns
        (text, notes)."""
        notes, kept = [], []
        for gpu, g in groups(b.body):
            if gpu and not self.gpu:
                notes.append("GPU-only lines left out: the daemon has no GPU")
                continue
            kept.append(g)
        lines, cont = [], False
        for ln in "\n\n".join(kept).splitlines():
            cmd = ln.split("  #")[0].strip()
            if not cont and cmd in SETUP:
                notes.append("`%s` left out: %s" % (cmd, SETUP[cmd]))
                ln = "# (left out) " + ln
            lines.append(ln)
            cont = ln.endswith("\\")
        return self.subst("\n".join(lines) + "\n"), notes

    def report(self, b, rc, out, err, notes, spec, cwd, what=""):
        name = "%s runs%s%s" % (b.name, what, (" (%s)" % "; ".join(notes)) if notes else "")
        if not self.tap.ok(rc == 0, name, "exit %s\n--- stderr\n%s\n--- stdout\n%s" % (rc, err[-3000:], out[-1500:])):
            return
        if spec.get("check"):
            try:
                results = spec["check"](Ctx(cwd, out, err, self.d, self.gpu))
            except Exception:  # noqa: BLE001 - a file it should have written is missing or malformed
                import traceback
                results = [(False, "what it wrote can be read", traceback.format_exc())]
            for cond, what_, diag in results:
                self.tap.ok(cond, "%s: %s" % (b.name, what_), diag)

    def run_sh(self, b, spec, cwd):
        text, notes = self.text_of(b)
        if spec.get("each"):
            text = "\n".join(c + "\n" + spec["each"] for c in commands(text)) + "\n"
        rc, out, err = self.sh(text, cwd)
        self.report(b, rc, out, err, notes, spec, cwd)

    def run_console(self, b, spec, cwd):
        parts = re.split(r"^\$ (.*)\n", b.body, flags=re.M)[1:]
        ok, diag = True, []
        for cmd, shown in zip(parts[0::2], parts[1::2]):
            rc, out, err = self.sh(self.subst(cmd), cwd)
            if rc != 0:
                ok = False
                diag.append("$ %s: exit %d\n%s" % (cmd, rc, err[-1500:]))
                continue
            try:
                want = json.loads(shown)
            except ValueError:
                want = None
            if want is not None:
                try:
                    good = same_keys(want, json.loads(out))
                except ValueError:
                    good = False
                why = "not the JSON shown (its keys): %s" % out[:1500]
            else:
                good, missing = key_lines_in_order(shown, out)
                why = "lines missing or out of order: %r\n%s" % (missing, out[:1500])
            if not good:
                ok = False
                diag.append("$ %s: %s" % (cmd, why))
        self.tap.ok(ok and parts, "%s runs and prints what it shows" % b.name, "\n".join(diag) or "no $ lines")

    def python_for(self, text):
        if "tritonclient" not in text:
            return sys.executable, None
        if self.venv_py is None:
            py = os.path.join(VENV, "bin", "python")
            p = subprocess.run([os.path.join(REPO, "scripts", "venv.sh"), VENV, "tritonclient[http]"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
            last = (p.stdout.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
            self.venv_py = (py, None) if p.returncode == 0 else \
                (None, "no %s with tritonclient[http]: %s" % (VENV, last))
        return self.venv_py

    def run_python(self, b, spec, cwd):
        text, notes = self.text_of(b)
        py, why = self.python_for(text)
        if py is None:
            self.tap.skip("%s runs" % b.name, why)
            return
        path = os.path.join(cwd, "block-%d.py" % b.line)
        with open(path, "w") as f:
            f.write(text + "\n# ---- the test's checks\n" + spec.get("post", ""))
        p = subprocess.run([py, path], cwd=cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=300 * SLOW)
        out, err = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
        what = ", and what it computed is right" if spec.get("post") else ""
        self.report(b, p.returncode, out, err, notes, spec, cwd, what)

    def run_c(self, b, spec, cwd):
        src = os.path.join(cwd, "block-%d.c" % b.line)
        with open(src, "w") as f:
            f.write(self.subst(b.body))
        exe = src[:-2]
        build = ("cc -Wall -Wextra -Werror %s $(PKG_CONFIG_PATH=lib/pkgconfig pkg-config --cflags --libs gemm) "
                 "-Wl,-rpath,$PWD/lib -o %s" % (src, exe))
        rc, out, err = self.sh(build + " && " + exe, cwd)
        self.report(b, rc, out, err, [], spec, cwd, ", built with the documented pkg-config line")


# ---------------------------------------------------------------------------- static checks

def static_checks(tap, all_blocks):
    unfailing, unset, cpu_lacks, unlabelled = [], [], [], []
    for b in all_blocks:
        if b.lang not in RUNNABLE:
            if not b.lang and re.match(r"(\$ |curl |gemm |bin/gemm |make( |$)|cc |python3? |pip |docker |kubectl )",
                                       b.first):
                unlabelled.append(b.name)
            continue
        for cmd in commands(b.body):
            cmd = re.sub(r"\s#.*", "", cmd)  # a comment after the command
            if re.search(r"\bcurl\b", cmd) and re.search(r"\s-o\s+(?!/dev/null)\S", cmd) \
                    and "--fail-with-body" not in cmd and not re.search(r"\s(-f|--fail)\s", cmd):
                unfailing.append("%s: %s" % (b.name, cmd))
        use = b.body.find("$ID")
        if use >= 0 and not re.search(r"^\s*ID=", b.body[:use], re.M):
            unset.append(b.name)
        for gpu, g in groups(b.body):
            if gpu or gpu_only(b.body):
                continue
            lines = [ln for ln in g.splitlines() if b.lang != "console" or ln.startswith("$ ")]  # not its output
            code = "\n".join(re.sub(r"(^|\s)#.*", "", ln) for ln in lines)  # comments out
            for k in re.findall(r'kernel(?:=|"\s*:\s*"|\s+|=")([\w.-]+)', code):
                if k not in CPU_KERNELS and k != "NAME":
                    cpu_lacks.append("%s: kernel %s" % (b.name, k))
    tap.ok(not unfailing, "every curl that writes its answer to a file uses --fail-with-body", unfailing)
    tap.ok(not unset, "every example that uses $ID shows where it comes from", unset)
    tap.ok(not cpu_lacks, "every example naming a kernel the CPU backend lacks is marked GPU only", cpu_lacks)
    tap.ok(not unlabelled, "every block that starts with a command is labelled (sh or console)", unlabelled)
    stale = [k for k in list(NOT_RUN) + list(SPECS)
             if sum(1 for b in all_blocks if b.lang in RUNNABLE and b.key_of({k: 0})) != 1]
    tap.ok(not stale, "NOT_RUN and SPECS each name one block the docs have", stale)
    twice = [b.name for b in all_blocks if len(b.key_of(NOT_RUN) + b.key_of(SPECS)) > 1]
    tap.ok(not twice, "no block is named twice in NOT_RUN and SPECS", twice)
    tap.ok(any(gpu for b in all_blocks if b.lang == "sh" for gpu, _ in groups(b.body)),
           "the GPU-only examples are marked as such")


def api_raw_example(tap, d):
    """API.md's raw request: its Content-Length is (m*k + k*n) * size(dtype), and the daemon
    takes exactly that many bytes."""
    api = read("docs/API.md")
    m = re.search(r"POST /v1/matmul\?m=(\d+)&k=(\d+)&n=(\d+)&dtype=(\w+)\n(?:.*\n)*?Content-Length: (\d+)", api)
    if not tap.ok(m is not None, "API.md has a raw request example with its Content-Length"):
        return
    mm, kk, nn, dt, cl = int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4), int(m.group(5))
    npdt = {"float32": "<f4", "float64": "<f8", "int32": "<i4"}[dt]
    tap.eq(cl, (mm * kk + kk * nn) * np.dtype(npdt).itemsize, "API.md: Content-Length is (m*k + k*n) * size(dtype)")
    rng = np.random.default_rng(3)
    A = rng.integers(-9, 9, size=(mm, kk)).astype(npdt)
    B = rng.integers(-9, 9, size=(kk, nn)).astype(npdt)
    path = "/v1/matmul?m=%d&k=%d&n=%d&dtype=%s" % (mm, kk, nn, dt)
    head = ("POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/octet-stream\r\n"
            "Content-Length: %d\r\nConnection: close\r\n\r\n" % (path, d.port, cl))
    st, _, rb, _ = raw_request(d.port, head.encode(), (A.tobytes() + B.tobytes())[:cl], read_timeout=30 * SLOW)
    got = np.frombuffer(rb, dtype=npdt) if st == 200 else None
    tap.ok(st == 200 and got.size == mm * nn and np.array_equal(got.reshape(mm, nn), A @ B),
           "API.md's raw example: the daemon takes exactly Content-Length bytes and answers A.B", (st, rb[:300]))


def json_objects(text):
    """The JSON values of a block, one after the other."""
    dec, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        obj, i = dec.raw_decode(text, i)
        out.append(obj)


def json_examples(tap, d, all_blocks):
    """The /v1 JSON shown in README.md and API.md (V2.md's: tests/e2e/test_v2.py): requests
    are answered 200, answers have the keys of a real answer to their request, and errors are
    what the request their message describes gets, word for word."""
    for b in all_blocks:
        if b.lang != "json" or b.doc not in ("README.md", "docs/API.md"):
            continue
        try:
            objs = json_objects(b.body)
        except ValueError as e:
            tap.ok(False, "%s is JSON" % b.name, str(e))
            continue
        for o in objs:
            if "a" in o and "b" in o:
                r = d.curl("POST", "/v1/matmul", data=json.dumps(o).encode(), content_type="application/json")
                tap.ok(r.status == 200, "%s: the request shown is answered 200" % b.name, r)
            elif "c" in o:
                r = d.curl("POST", "/v1/matmul", data=b'{"a": [[1, 2], [3, 4]], "b": [[5, 6], [7, 8]]}',
                           content_type="application/json")
                got = r.json() or {}
                tap.ok(r.status == 200 and same_keys(o, got) and got.get("c") == o["c"],
                       "%s: the answer shown has a real answer's fields and C" % b.name, (sorted(o), r))
            elif "error" in o:
                m = re.search(r"A is (\d+)x(\d+) and B is (\d+)x(\d+)", json.dumps(o))
                req = {"a": np.ones((int(m.group(1)), int(m.group(2)))).tolist(),
                       "b": np.ones((int(m.group(3)), int(m.group(4)))).tolist()} if m else {}
                r = d.curl("POST", "/v1/matmul", data=json.dumps(req).encode(), content_type="application/json")
                tap.ok(m and r.status == 422 and r.json() == o, "%s: the error shown is the daemon's, word for word"
                       % b.name, r)
            else:
                tap.ok(False, "%s: a request (a, b), an answer (c) or an error" % b.name, o)


def example_header_lines(tap, d, tmp):
    """The source-tree build lines in docs/examples/multiply.c's header, as written."""
    example = "docs/examples/multiply.c"
    head = re.sub(r"\\\n \*\s*", " ", read(example).split("*/")[0])
    lines = [ln.strip(" *") for ln in head.splitlines() if ln.strip(" *").startswith("cc ") and "lib/pkgconfig" in ln]
    tap.ok(lines, "%s's header gives its source-tree build line" % example)
    for i, cmd in enumerate(lines):
        name = "%s: %s" % (example, cmd)
        if SAN:
            tap.skip(name, "the documented lines use the normal build's lib/ (make test runs them)")
            continue
        exe = os.path.join(tmp, "multiply-%d" % i)
        p = subprocess.run(["bash", "-c", re.sub(r"-o \S+", "-o " + exe, cmd)], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
        if tap.ok(p.returncode == 0, "as written, from the source tree: " + name, p.stderr.decode()):
            r = subprocess.run([exe, "127.0.0.1:%d" % d.port], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=60 * SLOW)
            tap.ok(r.returncode == 0 and b"kernel" in r.stdout,
                   "the program it builds runs (server host:port): " + name,
                   (r.returncode, r.stdout, r.stderr))


def dockerfile_checks(tap, d):
    df = re.sub(r"\\\n", " ", read("Dockerfile"))  # continuation lines joined
    stages = {}
    for st in re.split(r"^FROM ", df, flags=re.M)[1:]:
        m = re.match(r"\S+ AS (\S+)", st)
        stages[m.group(1) if m else ""] = st

    def apt_packages(stage):
        pk = []
        for run in re.findall(r"apt-get install[^\n]*", stage):
            run = run.split("&&")[0]
            pk += [w for w in run.split()[2:] if not w.startswith("-")]
        return set(pk)

    def deps_list(*kinds):
        return subprocess.run([os.path.join(REPO, "scripts", "deps.sh"), "--list"] + list(kinds),
                              stdout=subprocess.PIPE).stdout.decode().split()

    tap.ok(list(stages) == ["cpu-build", "cpu", "gpu-build", "gpu"],
           "Dockerfile: stages cpu-build, cpu, gpu-build, gpu (the last, the GPU image, is the default)",
           list(stages))
    for stage, kinds in (("cpu-build", ["build"]), ("gpu-build", ["build", "cuda"])):
        want, have = deps_list(*kinds), apt_packages(stages.get(stage, ""))
        tap.ok(want and set(want) <= have and ("g++" in want) == ("cuda" in kinds),
               "Dockerfile: %s installs every package of deps.sh %s" % (stage, " ".join(kinds)),
               (sorted(set(want) - have), sorted(have)))
    tap.ok(apt_packages(stages.get("cpu", "")) == apt_packages(stages.get("gpu", "x")),
           "Dockerfile: both runtime images install the same libraries",
           (apt_packages(stages.get("cpu", "")), apt_packages(stages.get("gpu", ""))))
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", df.split("\nFROM ")[0], re.M))
    froms = re.findall(r"^FROM \$\{(\w+)\}", df, re.M)
    tap.ok(froms == ["CPU_BUILD_BASE", "CPU_RUNTIME_BASE", "CUDA_BUILD_BASE", "CUDA_RUNTIME_BASE"]
           and all(args.get(f) for f in froms) and "nvidia/cuda:" in args.get("CUDA_RUNTIME_BASE", ""),
           "Dockerfile: every base image is a build argument with a default (nvidia/cuda for the GPU image)",
           (froms, args))
    for name in ("cpu", "gpu"):
        runtime = stages.get(name, "")
        tap.ok("curl" not in apt_packages(runtime), "Dockerfile: the %s image installs no curl" % name,
               sorted(apt_packages(runtime)))
        user = re.search(r"^USER (\d+)(?::(\d+))?$", runtime, re.M)
        tap.ok(user and int(user.group(1)) != 0 and "useradd" in runtime and "--uid " + user.group(1) in runtime,
               "Dockerfile: the %s image runs as the numeric non-root user it creates" % name,
               user and user.group(0))
        tap.ok(re.search(r"^ENV GEMMD_LISTEN=0\.0\.0\.0$", runtime, re.M) and
               re.search(r"^COPY config/gemmd\.conf /etc/gemmd/gemmd\.conf$", runtime, re.M) and
               re.search(r'^CMD \["gemmd", "--config", "/etc/gemmd/gemmd.conf"\]$', runtime, re.M),
               "Dockerfile: the %s image runs the shipped config, listening on every interface" % name)
        hc = re.search(r"^HEALTHCHECK[^\n]*", runtime, re.M)
        cmd = None
        if hc:
            cm = re.search(r"CMD\s+(\[.*\])", hc.group(0))
            cmd = json.loads(cm.group(1)) if cm else None
        copied = " ".join(re.findall(r"^COPY [^\n]*", runtime, re.M))
        if not tap.ok(cmd and cmd[0] == "gemm" and "bin/gemm " in copied + " ",
                      "Dockerfile: the %s image's HEALTHCHECK runs gemm (exec form), which it copies in" % name,
                      (cmd, copied)):
            continue
        env = dict(os.environ, GEMM_SERVER=d.base)
        p = subprocess.run([GEMM_BIN] + cmd[1:], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=30 * SLOW)
        tap.ok(p.returncode == 0, "the %s HEALTHCHECK command passes against a live daemon" % name,
               (p.returncode, p.stdout, p.stderr))
        env["GEMM_SERVER"] = "http://127.0.0.1:%d" % free_port()
        p = subprocess.run([GEMM_BIN] + cmd[1:], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=30 * SLOW)
        tap.ok(p.returncode != 0, "the %s HEALTHCHECK command fails when nothing answers" % name, p.returncode)


def has_gpu():
    try:
        p = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0 and b"GPU" in p.stdout


def main(tap):
    tmp = tempfile.TemporaryDirectory(prefix="gemm-docs-")
    all_blocks = [b for doc in DOCS for b in blocks(doc)]
    static_checks(tap, all_blocks)
    with Daemon(tap, config={"backend": "auto" if has_gpu() else "cpu"}) as d:
        info = d.curl("GET", "/v1/info").json() or {}
        gpu = info.get("backend") == "cuda"
        if not gpu:
            tap.eq({k.get("name") for k in info.get("kernels", [])}, CPU_KERNELS,
                   "the CPU backend's kernels are the ones the GPU-only marks assume")
        api_raw_example(tap, d)
        json_examples(tap, d, all_blocks)
        r = Runner(tap, d, gpu, tmp.name)
        for b in all_blocks:
            if b.lang in RUNNABLE:
                r.run(b)
        tap.ok(r.run_count + r.san_count >= 15, "the docs' examples ran (%d blocks; %d left to the normal build)"
               % (r.run_count, r.san_count))
        example_header_lines(tap, d, tmp.name)
        dockerfile_checks(tap, d)
    tmp.cleanup()


if __name__ == "__main__":
    run_guarded(Tap(), main)
