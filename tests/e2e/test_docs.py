#!/usr/bin/env python3
"""test_docs.py - the docs and the Dockerfile, tried the way a new user would.

- README's curl examples run as one shell script (set -e) against a CPU daemon, with the
  inputs they make themselves; the answers they write are checked against NumPy. Groups
  whose comment says "GPU only" are left out, and every command that names a kernel the
  CPU backend lacks must be in such a group.
- Every curl command in README.md and docs/*.md that writes its output to a file uses
  --fail-with-body (so an error does not land silently in the file); every sh block that
  uses $ID sets it first.
- API.md's raw example: its Content-Length is (m*k + k*n) * size(dtype), the daemon takes
  exactly that many bytes, and its curl line works.
- The `cc` build lines of README.md, docs/CLIENT.md and docs/examples/multiply.c work as
  written from the source tree (after `make`), and the program they build runs.
- The Dockerfile: its stages (CPU and GPU, each a build stage and an image; the GPU image
  last, the default) and base images as build arguments; each build stage installs every
  package scripts/deps.sh names for its build (g++ for nvcc); both images install the same
  libraries and no curl, run as a numeric non-root user, listen on every interface with
  the shipped config; their HEALTHCHECK command (gemm health, shipped in the image) passes
  against a live daemon and fails against none. (make container-test builds and runs it.)
"""

import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import REPO, SLOW, Daemon, Tap, free_port, raw_request, run_guarded  # noqa: E402

GEMM_BIN = os.environ.get("GEMM_BIN", "bin/gemm")
if not os.path.isabs(GEMM_BIN):
    GEMM_BIN = os.path.join(REPO, GEMM_BIN)
SAN = os.environ.get("SAN") == "1"
DOCS = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(REPO, "docs")) if f.endswith(".md"))


def read(path):
    with open(os.path.join(REPO, path)) as f:
        return f.read()


def code_blocks(text, lang=None):
    """Fenced code blocks as (language, body)."""
    out = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
        if lang is None or m.group(1) == lang:
            out.append((m.group(1), m.group(2)))
    return out


def commands(block):
    """Shell commands of a block: continuation lines joined, comments and blanks dropped."""
    cmds, cur = [], ""
    for line in block.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            cmds.append(cur.strip())
            cur = ""
    return cmds


def groups(block):
    """A block split at blank lines: (is it "GPU only", its text)."""
    out = []
    for g in re.split(r"\n\s*\n", block):
        first_comment = next((ln for ln in g.splitlines() if ln.lstrip().startswith("#")), "")
        out.append(("GPU only" in first_comment, g))
    return out


def section(text, title):
    start = text.index(title)
    nxt = text.find("\n## ", start + len(title))
    return text[start:nxt if nxt >= 0 else len(text)]


def python_dir(tmp):
    """A folder whose python3 is this one (it has NumPy), to put first on PATH."""
    d = os.path.join(tmp, "pybin")
    os.makedirs(d, exist_ok=True)
    # A wrapper, not a symlink: a virtual environment's python found through a link in
    # another folder no longer sees its environment (nor its NumPy).
    w = os.path.join(d, "python3")
    with open(w, "w") as f:
        f.write("#!/bin/sh\nexec '%s' \"$@\"\n" % sys.executable.replace("'", "'\\''"))
    os.chmod(w, 0o755)
    return d


def main(tap):
    tmp = tempfile.TemporaryDirectory(prefix="gemm-docs-")
    T = tmp.name
    readme = read("README.md")

    # ------------------------------------------------------------ static checks of the docs
    unfailing = []
    for doc in DOCS:
        for lang, body in code_blocks(read(doc)):
            for cmd in commands(body):
                if re.search(r"\bcurl\b", cmd) and re.search(r"\s-o\s+(?!/dev/null)\S", cmd) \
                        and "--fail-with-body" not in cmd and not re.search(r"\s(-f|--fail)\s", cmd):
                    unfailing.append("%s: %s" % (doc, cmd))
    tap.ok(not unfailing, "every curl that writes its answer to a file uses --fail-with-body", unfailing)
    unset = []
    for doc in DOCS:
        for lang, body in code_blocks(read(doc)):
            use = body.find("$ID")
            if use >= 0 and not re.search(r"^\s*ID=", body[:use], re.M):
                unset.append(doc)
    tap.ok(not unset, "every example that uses $ID shows where it comes from", unset)

    # ------------------------------------------------------------ API.md's raw example
    api = read("docs/API.md")
    m = re.search(r"POST /v1/matmul\?m=(\d+)&k=(\d+)&n=(\d+)&dtype=(\w+)\n(?:.*\n)*?Content-Length: (\d+)", api)
    if tap.ok(m is not None, "API.md has a raw request example with its Content-Length"):
        mm, kk, nn, dt, cl = int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4), int(m.group(5))
        size = np.dtype({"float32": np.float32, "float64": np.float64, "int32": np.int32}[dt]).itemsize
        tap.eq(cl, (mm * kk + kk * nn) * size, "API.md: Content-Length is (m*k + k*n) * size(dtype)")

    # ------------------------------------------------------------ against a CPU daemon
    with Daemon(tap, config={"backend": "cpu"}) as d:
        S = "127.0.0.1:%d" % d.port
        info = d.curl("GET", "/v1/info").json() or {}
        cpu_kernels = {k.get("name") for k in info.get("kernels", [])}

        if m is not None:
            rng = np.random.default_rng(3)
            npdt = {"float32": "<f4", "float64": "<f8", "int32": "<i4"}[dt]
            A = rng.integers(-9, 9, size=(mm, kk)).astype(npdt)
            B = rng.integers(-9, 9, size=(kk, nn)).astype(npdt)
            body = A.tobytes() + B.tobytes()
            path = "/v1/matmul?m=%d&k=%d&n=%d&dtype=%s" % (mm, kk, nn, dt)
            head = ("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\n"
                    "Content-Length: %d\r\nConnection: close\r\n\r\n" % (path, S, cl))
            st, _, rb, _ = raw_request(d.port, head.encode(), body[:cl], read_timeout=30 * SLOW)
            got = np.frombuffer(rb, dtype=npdt) if st == 200 else None
            tap.ok(st == 200 and got.size == mm * nn and np.array_equal(got.reshape(mm, nn), A @ B),
                   "API.md's raw example: the daemon takes exactly Content-Length bytes and answers A.B", (st, rb[:300]))
            for lang, blk in code_blocks(api, "sh"):
                if "octet-stream" in blk and "m=%d&k=%d&n=%d" % (mm, kk, nn) in blk:
                    A.tofile(os.path.join(T, "A.bin"))
                    B.tofile(os.path.join(T, "B.bin"))
                    p = subprocess.run(["bash", "-euo", "pipefail", "-c", blk.replace("localhost:8080", S)],
                                       cwd=T, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60 * SLOW)
                    got = np.fromfile(os.path.join(T, "C.bin"), dtype=npdt) if p.returncode == 0 else None
                    ref = (A.astype(np.float64) @ B.astype(np.float64)).ravel()
                    tap.ok(got is not None and got.size == ref.size and np.allclose(got, ref),
                           "API.md's curl line for the raw example works", (p.returncode, p.stderr.decode()))
                    break
            else:
                tap.ok(False, "API.md has a curl line for its raw example")

        # README's curl examples as one script
        block = section(readme, "## Examples with curl")
        sh = code_blocks(block, "sh")
        if tap.ok(len(sh) == 1, "README has one sh block of curl examples"):
            text = sh[0][1]
            gs = groups(text)
            wrong = []
            for gpu, g in gs:
                for cmd in commands(g):
                    for k in re.findall(r'kernel(?:=|"\s*:\s*")([\w.-]+)', cmd):
                        if k not in cpu_kernels and not gpu:
                            wrong.append(cmd)
            tap.ok(not wrong, "README: every example naming a kernel the CPU backend lacks is marked GPU only",
                   wrong)
            tap.ok(sum(1 for gpu, _ in gs if gpu) >= 1, "README: the GPU-only examples are marked as such")
            script = "\n\n".join(g for gpu, g in gs if not gpu).replace("localhost:8080", S)
            run_dir = os.path.join(T, "readme")
            os.makedirs(run_dir)
            env = dict(os.environ, PATH=python_dir(T) + os.pathsep + os.environ.get("PATH", ""))
            p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=run_dir, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300 * SLOW)
            tap.ok(p.returncode == 0, "README's curl examples (all but GPU only) run as a script with set -e",
                   (p.returncode, p.stderr.decode()[-2000:], p.stdout.decode()[-1000:]))
            if p.returncode == 0:
                A = np.load(os.path.join(run_dir, "A.npy"))
                B = np.load(os.path.join(run_dir, "B.npy"))
                C = np.load(os.path.join(run_dir, "C.npy"))
                tap.ok(C.shape == (A.shape[0], B.shape[1]) and np.allclose(C, A @ B),
                       "README: the async example's C.npy is A.B (NumPy)")
                a32 = np.fromfile(os.path.join(run_dir, "A.bin"), dtype="<f4").reshape(1024, 1024)
                b32 = np.fromfile(os.path.join(run_dir, "B.bin"), dtype="<f4").reshape(1024, 1024)
                c32 = np.fromfile(os.path.join(run_dir, "C.bin"), dtype="<f4").reshape(1024, 1024)
                ref = a32.astype(np.float64) @ b32.astype(np.float64)
                tap.ok(np.allclose(c32, ref, rtol=1e-4, atol=1e-3), "README: the raw example's C.bin is A.B")
                out = p.stdout.decode()
                tap.ok('"c":[[19,22],[43,50]]' in out and '"c":[[14],[32]]' in out,
                       "README: the JSON examples answer what they say", out[:600])
                r = d.curl("GET", "/readyz").json() or {}
                tap.ok(r.get("queued") == 0, "README: the async example leaves no job queued", r)

        # ------------------------------------------------------------ build lines
        lines = []
        for doc in ("README.md", "docs/CLIENT.md"):
            for lang, body in code_blocks(read(doc)):
                lines += [(doc, c) for c in commands(body) if c.startswith("cc ") and "lib/pkgconfig" in c]
        example = "docs/examples/multiply.c"
        head = read(example).split("*/")[0]
        joined = re.sub(r"\\\n \*\s*", " ", head)
        lines += [(example, ln.strip(" *")) for ln in joined.splitlines() if ln.strip(" *").startswith("cc ")
                  and "lib/pkgconfig" in ln]
        tap.ok(len(lines) >= 4 and any(e == example for e, _ in lines) and any("gemm-static" in c for _, c in lines),
               "the docs give source-tree build lines (README, CLIENT.md, the example; shared and static)", lines)
        for i, (doc, cmd) in enumerate(lines):
            name = "%s: %s" % (doc, cmd)
            if SAN:
                tap.skip(name, "the documented lines use the normal build's lib/ (make test runs them)")
                continue
            exe = os.path.join(T, "prog-%d" % i)
            cmd2 = re.sub(r"-o \S+", "-o " + exe, cmd.replace("prog.c", example))
            if " -o " not in cmd2:
                cmd2 += " -o " + exe
            p = subprocess.run(["bash", "-c", cmd2], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if tap.ok(p.returncode == 0, "as written, from the source tree: " + name, p.stderr.decode()):
                r = subprocess.run([exe, d.base], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60 * SLOW)
                tap.ok(r.returncode == 0 and b"kernel" in r.stdout, "the program it builds runs: " + name,
                       (r.returncode, r.stdout, r.stderr))

        # ------------------------------------------------------------ the Dockerfile
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
    tmp.cleanup()


if __name__ == "__main__":
    run_guarded(Tap(), main)
