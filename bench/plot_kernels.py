#!/usr/bin/env python3
"""plot_kernels.py - bar charts of bench_kernels' CSV: TFLOP/s of every kernel per shape,
one panel per dtype/math mode, cuBLAS hatched as the yardstick.

    python3 bench/plot_kernels.py bench/results/kernels-h100.csv bench/results/kernels-h100.png

Needs matplotlib (Debian: python3-matplotlib; PyPI: matplotlib). Reads only the rows of
section "main" whose check passed.
"""
import csv
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = [("float32", "fp32"), ("float32", "tf32"), ("float32", "bf16"),
         ("float64", "exact"), ("int32", "exact")]
ORDER = ["naive", "tiled", "simt", "mma", "dmma", "wgmma", "cublas"]
COLORS = {"naive": "#bbbbbb", "tiled": "#888888", "simt": "#2ca02c", "mma": "#1f77b4",
          "dmma": "#d62728", "wgmma": "#9467bd", "cublas": "#ff7f0e"}


def shape_label(r):
    m, n, k = r["m"], r["n"], r["k"]
    return m if m == n == k else "%sx%sx%s" % (m, n, k)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_kernels.py KERNELS.csv OUT.png")
    rows = [r for r in csv.DictReader(open(sys.argv[1]))
            if r["section"] == "main" and r["status"] == "ok"]
    if not rows:
        sys.exit("no passing rows in " + sys.argv[1])
    device = rows[0]["device"]
    fig, axes = plt.subplots(len(MODES), 1, figsize=(13, 4.2 * len(MODES)))
    for ax, (dtype, math) in zip(axes, MODES):
        sel = [r for r in rows if r["dtype"] == dtype and r["math"] == math]
        shapes = list(OrderedDict((shape_label(r), None) for r in sel))
        kernels = [k for k in ORDER if any(r["kernel"] == k for r in sel)]
        kernels += sorted({r["kernel"] for r in sel} - set(kernels))
        width = 0.8 / max(1, len(kernels))
        for i, kname in enumerate(kernels):
            vals = []
            for s in shapes:
                hit = [float(r["tflops"]) for r in sel
                       if r["kernel"] == kname and shape_label(r) == s]
                vals.append(hit[0] if hit else 0.0)
            xs = [j + (i - (len(kernels) - 1) / 2) * width for j in range(len(shapes))]
            ax.bar(xs, vals, width, label=kname, color=COLORS.get(kname),
                   hatch="//" if kname == "cublas" else None,
                   edgecolor="black", linewidth=0.4)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, rotation=20, fontsize=8)
        ax.set_ylabel("TFLOP/s" if dtype != "int32" else "TOP/s")
        ax.set_title("%s %s" % (dtype, "" if math == "exact" else "math=" + math))
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, ncol=len(kernels))
    fig.suptitle("gemmd kernel family vs cuBLAS - %s (median of repeats, L2 flushed)" % device)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(sys.argv[2], dpi=90)


if __name__ == "__main__":
    main()
