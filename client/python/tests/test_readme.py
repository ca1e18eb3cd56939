"""The package README's first example runs as written against the daemon (with its URL,
smaller matrices, and the GPU-only line, the one naming cublas, left out)."""

import os
import re

import numpy as np

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def test_readme_example_runs(server, monkeypatch):
    monkeypatch.delenv("GEMM_TOKEN", raising=False)
    text = open(README, encoding="utf-8").read()
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert 'gemmd.Client("http://gpu-box:8080", token="...")' in block
    code = block.replace('"http://gpu-box:8080", token="..."', repr(server.base)).replace("4096", "256")
    code = "\n".join(line for line in code.splitlines() if "cublas" not in line)
    ns = {}
    exec(compile(code, README, "exec"), ns)  # noqa: S102 - our own documentation
    a, b, c, cs, stack = ns["a"], ns["b"], ns["c"], ns["cs"], ns["stack"]
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert c.shape == (256, 256) and c.dtype == np.float32
    assert np.allclose(c, ref, rtol=1e-4, atol=1e-3)
    assert cs.shape == (1000, 64, 64)
    assert ns["p"].kernel == "openblas" and ns["p"].timing.kernel_ms > 0
