"""test_python.py - the Python package (client/python) installed with pip and tested with
pytest against the real daemon, reported as TAP.

Makes a virtual environment ($GEMM_PYVENV, default build/pyvenv; scripts/venv.sh: from
/usr/bin/python3 with the system's site packages, so Debian's NumPy is used), installs
pytest from PyPI and the package from a clean copy of client/python, checks what was
installed, then runs client/python/tests with pytest and turns each test case of its
JUnit XML report into one TAP line. When the environment or pytest cannot be had (no
python3-venv and not root, PyPI unreachable), the tests are reported as one SKIP with
the reason.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

from harness import REPO, SLOW, Tap, run_guarded

VENV = os.environ.get("GEMM_PYVENV") or os.path.join(REPO, "build", "pyvenv")
VENV_SH = os.path.join(REPO, "scripts", "venv.sh")
PKG = os.path.join(REPO, "client", "python")


def sh(args, timeout=600, env=None):
    try:
        p = subprocess.run(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, env=env)
        return p.returncode, p.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as e:
        return 124, (e.stdout or b"").decode("utf-8", "replace") + "\n(timed out after %ds)" % timeout


def tail(text, lines=15):
    return "\n".join(text.strip().splitlines()[-lines:])


def main(tap):
    # ---- the environment and pytest
    rc, out = sh([VENV_SH, VENV, "pytest"])
    if rc != 0:
        tap.skip("python client: pytest in a virtual environment", "could not make %s with pytest: %s"
                 % (os.path.relpath(VENV, REPO), tail(out, 3).replace("\n", " / ")))
        return
    py = os.path.join(VENV, "bin", "python")

    # ---- the package, as `pip install client/python` installs it (from a clean copy, so
    # that no build/ or egg-info is left in the source tree and none from an earlier build
    # is picked up)
    tmp = tempfile.TemporaryDirectory(prefix="gemmd-pypkg-")
    try:
        src = os.path.join(tmp.name, "python")
        shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__",
                                                                ".pytest_cache", "tests"))
        # Offline first (setuptools and wheel from Debian), else with pip's isolated build
        # (setuptools from PyPI).
        rc, out = sh([VENV_SH, VENV, "--no-build-isolation", "--no-deps", "--force-reinstall", src])
        if rc != 0:
            rc2, out2 = sh([VENV_SH, VENV, "--no-deps", "--force-reinstall", src])
            if rc2 != 0:
                rc3, _ = sh([py, "-c", "import setuptools"])
                if rc3 != 0:
                    tap.skip("python client: pip install client/python",
                             "no build backend: setuptools is neither installed (python3-setuptools) "
                             "nor downloadable: " + tail(out2, 2).replace("\n", " / "))
                    return
                tap.ok(False, "pip installs client/python", out + "\n" + out2)
                return
        tap.ok(True, "pip installs client/python into %s" % os.path.relpath(VENV, REPO))
    finally:
        tmp.cleanup()

    rc, out = sh([py, "-c", "import gemmd, numpy, importlib.metadata as m, json; "
                  "print(json.dumps([gemmd.__file__, gemmd.__version__, m.version('gemmd'), "
                  "m.requires('gemmd'), numpy.__version__]))"])
    info = json.loads(out.strip().splitlines()[-1]) if rc == 0 else None
    if not tap.ok(info is not None and os.path.realpath(info[0]).startswith(os.path.realpath(VENV) + os.sep),
                  "gemmd is imported from the environment, not the source tree", out):
        return
    tap.eq(info[1], info[2], "gemmd.__version__ is the installed package's version")
    deps = [d.split(";")[0].replace(" ", "") for d in (info[3] or [])]
    tap.ok(len(deps) == 1 and deps[0].lower().startswith("numpy"), "NumPy is the package's only dependency",
           info[3])
    rc, out = sh([py, "-c", "import importlib.resources as r, gemmd; "
                  "print((r.files('gemmd') / 'py.typed').is_file())"])
    tap.ok(rc == 0 and out.strip().endswith("True"), "the package is marked typed (py.typed installed)", out)

    # ---- the tests
    xml_dir = tempfile.TemporaryDirectory(prefix="gemmd-pytest-")
    try:
        junit = os.path.join(xml_dir.name, "junit.xml")
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        env.pop("GEMM_SERVER", None)
        env.pop("GEMM_TOKEN", None)
        env.pop("GEMM_CACERT", None)
        rc, out = sh([py, "-m", "pytest", os.path.join(PKG, "tests"), "-p", "no:cacheprovider", "-q",
                      "-o", "junit_family=xunit1", "--junitxml", junit],
                     timeout=int(700 * SLOW), env=env)
        for line in out.strip().splitlines()[-1:]:
            tap.diag("pytest: " + line)
        cases = []
        try:
            cases = list(ET.parse(junit).getroot().iter("testcase"))
        except (OSError, ET.ParseError):
            pass
        if not cases:
            tap.ok(False, "pytest ran the package's tests (exit %d)" % rc, tail(out, 60))
            return
        for tc in cases:
            name = "python: %s::%s" % (tc.get("classname", "").split(".")[-1], tc.get("name", ""))
            bad = tc.find("failure")
            if bad is None:
                bad = tc.find("error")
            skipped = tc.find("skipped")
            if bad is not None:
                tap.ok(False, name, ((bad.get("message") or "") + "\n" + (bad.text or ""))[-3000:])
            elif skipped is not None:
                tap.skip(name, (skipped.get("message") or "skipped").replace("\n", " "))
            else:
                tap.ok(True, name)
        if rc not in (0, 1):
            tap.ok(False, "pytest finished (exit %d)" % rc, tail(out, 60))
    finally:
        xml_dir.cleanup()


if __name__ == "__main__":
    run_guarded(Tap(), main)
