#!/usr/bin/env python3
"""test_install.py - `make install` and `make uninstall` into a temporary DESTDIR.

Installs with PREFIX=/usr/local, then uses only what was installed: builds
docs/examples/multiply.c the way its own header says for an installed libgemm (pkg-config
gemm, and gemm-static for the archive), with pkg-config pointed into the DESTDIR
(PKG_CONFIG_SYSROOT_DIR + PKG_CONFIG_LIBDIR), runs it against the installed daemon
started with the installed config, checks the installed gemm.h stands alone, and that
gemm.pc, the unit (ExecStart, Documentation) and the config name the installed prefix, not
the source tree, and that the unit's TimeoutStopSec outlasts the config's shutdown_timeout.
Verifies the systemd unit with `systemd-analyze verify` when that exists. PREFIX=/usr puts the
config in /etc/gemmd. A second install keeps an edited config; uninstall removes every
file but an edited config.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np  # noqa: F401 - the e2e programs all run under the NumPy python

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import REPO, SLOW, Tap, free_port, run_guarded  # noqa: E402

SAN = os.environ.get("SAN") == "1"
SAN_FLAGS = ["-fsanitize=address,undefined"] if SAN else []
PREFIX = "/usr/local"


def make(*args, timeout=600):
    """make -C REPO with the build settings of this test run (so nothing is rebuilt)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    settings = ["CUDA=" + os.environ.get("CUDA", "0"), "SAN=" + ("1" if SAN else "0")]
    p = subprocess.run(["make", "--no-print-directory", "-C", REPO] + settings + list(args), env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout * SLOW)
    return p.returncode, p.stdout.decode("utf-8", "replace")


def files_under(root):
    out = []
    for d, _, fs in os.walk(root):
        for f in fs:
            out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(out)


def build_lines(path):
    """The `cc ...` command lines of a C file's header comment (continuations joined)."""
    lines, cur = [], None
    for raw in open(path).read().split("*/")[0].splitlines():
        text = raw.strip().lstrip("*").strip()
        if cur is not None:
            cur += " " + text.rstrip("\\").strip()
            if not text.endswith("\\"):
                lines.append(cur)
                cur = None
        elif text.startswith("cc "):
            if text.endswith("\\"):
                cur = text.rstrip("\\").strip()
            else:
                lines.append(text)
    return lines


def main(tap):
    if not shutil.which("pkg-config"):
        tap.skip("make install", "no pkg-config (scripts/deps.sh build installs it)")
        return
    tmp = tempfile.TemporaryDirectory(prefix="gemm-install-")
    dest = os.path.join(tmp.name, "root")
    rc, out = make("install", "DESTDIR=" + dest, "PREFIX=" + PREFIX)
    if not tap.ok(rc == 0, "make install DESTDIR=... PREFIX=/usr/local", out[-3000:]):
        return
    P = dest + PREFIX
    want = ["bin/gemmd", "bin/gemm", "include/gemm.h", "include/gemm_util.h", "lib/libgemm.a",
            "lib/libgemm.so.1.0.0", "lib/libgemm_blas.so", "lib/pkgconfig/gemm.pc", "lib/pkgconfig/gemm-static.pc",
            "etc/gemmd/gemmd.conf", "lib/systemd/system/gemmd.service", "lib/sysusers.d/gemmd.conf",
            "share/doc/gemmd/README.md", "share/doc/gemmd/API.md", "share/doc/gemmd/BLAS.md", "share/doc/gemmd/examples/multiply.c"]
    missing = [w for w in want if not os.path.isfile(os.path.join(P, w))]
    tap.ok(not missing, "install puts the daemon, client, library, headers, gemm.pc, config, unit and docs "
           "under PREFIX", missing)
    links = {n: os.readlink(os.path.join(P, "lib", n)) if os.path.islink(os.path.join(P, "lib", n)) else None
             for n in ("libgemm.so", "libgemm.so.1")}
    tap.eq(links, {"libgemm.so": "libgemm.so.1", "libgemm.so.1": "libgemm.so.1.0.0"},
           "libgemm.so -> libgemm.so.1 -> libgemm.so.1.0.0 (relative links)")
    tap.ok(os.access(os.path.join(P, "bin", "gemmd"), os.X_OK) and os.access(os.path.join(P, "bin", "gemm"), os.X_OK),
           "the programs are executable")

    # Installed text files name the installed prefix, never the source tree.
    texts = ["lib/pkgconfig/gemm.pc", "lib/pkgconfig/gemm-static.pc", "include/gemm.h", "include/gemm_util.h",
             "lib/systemd/system/gemmd.service", "etc/gemmd/gemmd.conf"]
    leaks = [t for t in texts if os.path.exists(os.path.join(P, t)) and REPO in open(os.path.join(P, t)).read()]
    tap.ok(not leaks, "no installed text file names the source tree", leaks)
    pc = open(os.path.join(P, "lib/pkgconfig/gemm.pc")).read()
    tap.ok(re.search(r"^prefix=/usr/local$", pc, re.M) and "libdir=${prefix}/lib" in pc
           and "includedir=${prefix}/include" in pc, "gemm.pc points at the installed prefix", pc)

    # The installed gemm.h stands alone: no gemm_types.h, compiles as C and C++.
    hdr = open(os.path.join(P, "include", "gemm.h")).read()
    tap.ok("gemm_types.h\"" not in hdr and "} gemm_dtype;" in hdr and "} gemm_math;" in hdr,
           "the installed gemm.h carries gemm_dtype and gemm_math instead of including gemm_types.h")
    probe = os.path.join(tmp.name, "probe.c")
    with open(probe, "w") as f:
        f.write("#include <gemm.h>\n#include <gemm_util.h>\nint main(void) { gemm_dtype d = GEMM_DTYPE_F32; "
                "return (int)d + (int)GEMM_MATH_TF32 - 2; }\n")
    cp = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only",
                         "-I" + os.path.join(P, "include"), probe], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tap.ok(cp.returncode == 0, "the installed headers compile on their own (C11, -Wall -Wextra -pedantic)",
           cp.stderr.decode())
    if shutil.which("c++"):
        cp = subprocess.run(["c++", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-x", "c++",
                             "-I" + os.path.join(P, "include"), probe], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        tap.ok(cp.returncode == 0, "the installed headers compile as C++", cp.stderr.decode())
    else:
        tap.skip("the installed headers compile as C++", "no c++ compiler")

    # The example, built the way its header says for an installed libgemm.
    example = os.path.join(P, "share/doc/gemmd/examples/multiply.c")
    lines = [ln for ln in build_lines(example) if "lib/pkgconfig" not in ln]
    tap.ok(len(lines) == 2 and "gemm-static" in lines[1], "multiply.c documents its build against an installed "
           "libgemm, shared and static", lines)
    pkgenv = dict(os.environ, PKG_CONFIG_SYSROOT_DIR=dest, PKG_CONFIG_LIBDIR=os.path.join(P, "lib", "pkgconfig"))
    pkgenv.pop("PKG_CONFIG_PATH", None)
    exes = []
    for i, line in enumerate(lines[:2]):
        exe = os.path.join(tmp.name, "multiply-%d" % i)
        cmd = line.replace("-o multiply", "-o " + exe) + " " + " ".join(SAN_FLAGS)
        cp = subprocess.run(["bash", "-c", cmd], cwd=os.path.dirname(example), env=pkgenv,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        tap.ok(cp.returncode == 0 and os.path.exists(exe), "as documented: " + line, cp.stderr.decode())
        exes.append(exe)
    runenv = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(
        x for x in (os.path.join(P, "lib"), os.environ.get("LD_LIBRARY_PATH")) if x))
    if shutil.which("ldd") and len(exes) == 2 and all(os.path.exists(e) for e in exes):
        l0 = subprocess.run(["ldd", exes[0]], env=runenv, stdout=subprocess.PIPE).stdout.decode()
        l1 = subprocess.run(["ldd", exes[1]], env=runenv, stdout=subprocess.PIPE).stdout.decode()
        tap.ok(("libgemm.so.1 => " + os.path.join(P, "lib", "libgemm.so.1")) in l0,
               "the shared build loads the installed libgemm.so.1", l0)
        tap.ok("libgemm" not in l1, "the gemm-static build carries libgemm inside (no libgemm.so needed)", l1)

    # The installed daemon with the installed config (only the port moved), the installed
    # client and both example builds against it.
    conf = os.path.join(P, "etc", "gemmd", "gemmd.conf")
    port = free_port()
    p = subprocess.Popen([os.path.join(P, "bin", "gemmd"), "--config", conf, "--port", str(port), "--backend", "cpu"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = "http://127.0.0.1:%d" % port
        gemm = os.path.join(P, "bin", "gemm")
        ok = False
        for _ in range(int(100 * SLOW)):
            if subprocess.run([gemm, "-s", base, "health"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE).returncode == 0:
                ok = True
                break
            if p.poll() is not None:
                break
            time.sleep(0.1)
        tap.ok(ok, "the installed gemmd serves with the installed config; the installed gemm health says so")
        for exe in exes:
            if os.path.exists(exe):
                r = subprocess.run([exe, base], env=runenv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   timeout=60 * SLOW)
                tap.ok(r.returncode == 0 and b"kernel" in r.stdout, "%s runs against the installed daemon and "
                       "checks its answer" % os.path.basename(exe), (r.returncode, r.stdout, r.stderr))
    finally:
        p.terminate()
        try:
            out, _ = p.communicate(timeout=20 * SLOW)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        tap.ok(p.returncode == 0, "the installed gemmd exits 0 on SIGTERM", out.decode("utf-8", "replace")[-2000:])

    # The unit names the installed program and config.
    unit = open(os.path.join(P, "lib/systemd/system/gemmd.service")).read()
    tap.ok(re.search(r"^ExecStart=/usr/local/bin/gemmd --config /usr/local/etc/gemmd/gemmd.conf$", unit, re.M)
           and re.search(r"^User=gemmd$", unit, re.M) and re.search(r"^NoNewPrivileges=yes$", unit, re.M)
           and re.search(r"^ProtectSystem=strict$", unit, re.M) and re.search(r"^Restart=on-failure$", unit, re.M),
           "the unit runs $(bindir)/gemmd with $(sysconfdir)/gemmd/gemmd.conf as user gemmd, hardened, "
           "restarted on failure")
    doc = re.search(r"^Documentation=file:(\S+)$", unit, re.M)
    tap.ok(doc and doc.group(1) == PREFIX + "/share/doc/gemmd/OPERATIONS.md"
           and os.path.isfile(dest + doc.group(1)), "the unit's Documentation= names the installed OPERATIONS.md",
           doc and doc.group(0))
    # systemd's stop timeout covers the daemon's own: shutdown_timeout, then 30 s for the
    # products stopped past it to answer and the process to exit.
    stop = re.search(r"^TimeoutStopSec=(\d+)s$", unit, re.M)
    grace = re.search(r"^shutdown_timeout = (\d+)$", open(conf).read(), re.M)
    tap.ok(stop and grace and int(stop.group(1)) >= int(grace.group(1)) + 30,
           "TimeoutStopSec is at least the installed config's shutdown_timeout + 30 s",
           (stop and stop.group(0), grace and grace.group(0)))
    if not shutil.which("systemd-analyze"):
        tap.skip("systemd-analyze verify gemmd.service", "systemd-analyze not found (Debian package systemd)")
    else:
        # ExecStart must name an executable that exists: point it into the DESTDIR.
        vdir = os.path.join(tmp.name, "verify")
        os.makedirs(vdir)
        with open(os.path.join(vdir, "gemmd.service"), "w") as f:
            f.write(unit.replace("ExecStart=/usr/local/bin/", "ExecStart=" + P + "/bin/"))
        v = subprocess.run(["systemd-analyze", "verify", os.path.join(vdir, "gemmd.service")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        msgs = [ln for ln in (v.stdout + v.stderr).decode().splitlines() if "gemmd.service" in ln]
        tap.ok(v.returncode == 0 and not msgs, "systemd-analyze verify: the unit is valid, no unknown keys",
               (v.returncode, v.stdout.decode(), v.stderr.decode()))

    # A second install keeps an edited config.
    with open(conf, "a") as f:
        f.write("# edited by the operator\n")
    rc, out = make("install", "DESTDIR=" + dest, "PREFIX=" + PREFIX)
    tap.ok(rc == 0 and "edited by the operator" in open(conf).read(), "install again: an existing config is kept",
           out[-2000:])

    # uninstall: everything goes but the edited config; then that too once it is the shipped one.
    rc, out = make("uninstall", "DESTDIR=" + dest, "PREFIX=" + PREFIX)
    left = files_under(dest)
    tap.ok(rc == 0 and left == [os.path.relpath(conf, dest)], "make uninstall removes every file but the edited "
           "config", (rc, left, out[-1500:]))
    shutil.copyfile(os.path.join(REPO, "config", "gemmd.conf"), conf)
    rc, out = make("uninstall", "DESTDIR=" + dest, "PREFIX=" + PREFIX)
    tap.ok(rc == 0 and files_under(dest) == [], "make uninstall removes an unchanged config too",
           (files_under(dest), out[-1500:]))

    # PREFIX=/usr: config in /etc/gemmd, the unit says so.
    dest2 = os.path.join(tmp.name, "root-usr")
    rc, out = make("install", "DESTDIR=" + dest2, "PREFIX=/usr")
    unit2 = os.path.join(dest2, "usr/lib/systemd/system/gemmd.service")
    text2 = open(unit2).read() if os.path.isfile(unit2) else ""
    tap.ok(rc == 0 and os.path.isfile(os.path.join(dest2, "etc/gemmd/gemmd.conf"))
           and os.path.isfile(os.path.join(dest2, "usr/bin/gemmd"))
           and "ExecStart=/usr/bin/gemmd --config /etc/gemmd/gemmd.conf" in text2
           and "Documentation=file:/usr/share/doc/gemmd/OPERATIONS.md" in text2 and not [ln for ln in text2.splitlines() if "/usr/local" in ln and not ln.startswith("#")],
           "PREFIX=/usr: programs in /usr/bin, config in /etc/gemmd, the unit points there (docs too)",
           (out[-2000:], text2))
    tmp.cleanup()


if __name__ == "__main__":
    run_guarded(Tap(), main)
