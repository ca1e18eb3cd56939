#!/usr/bin/env python3
"""table_kernels.py - Markdown tables from bench_kernels' CSV: the main run (TFLOP/s of every
member per shape and % of cuBLAS in the same mode) or, with --tune, the tuning sweep.

    python3 bench/table_kernels.py bench/results/kernels-h100.csv
    python3 bench/table_kernels.py --tune bench/results/kernels-h100-tune-simt.csv

Only rows whose check passed are shown; a failed check prints FAIL in its cell.
"""
import csv
import sys
from collections import OrderedDict

# (column title, kernel, dtype, math, with % of cuBLAS)
MAIN_COLUMNS = [
    ("cuBLAS fp32", "cublas", "float32", "fp32", False),
    ("simt", "simt", "float32", "fp32", True),
    ("naive", "naive", "float32", "fp32", False),
    ("tiled", "tiled", "float32", "fp32", False),
    ("cuBLAS tf32", "cublas", "float32", "tf32", False),
    ("mma tf32", "mma", "float32", "tf32", True),
    ("wgmma tf32", "wgmma", "float32", "tf32", True),
    ("cuBLAS bf16*", "cublas", "float32", "bf16", False),
    ("mma bf16", "mma", "float32", "bf16", True),
    ("wgmma bf16", "wgmma", "float32", "bf16", True),
    ("cuBLAS f64", "cublas", "float64", "exact", False),
    ("dmma", "dmma", "float64", "exact", True),
    ("simt f64", "simt", "float64", "exact", True),
    ("int32 simt", "simt", "int32", "exact", False),
    ("int32 tiled", "tiled", "int32", "exact", False),
]


def shape_label(r):
    m, n, k = r["m"], r["n"], r["k"]
    return m if m == n == k else "%sx%sx%s" % (m, n, k)


def cell(r, pct):
    if r is None:
        return "-"
    if r["status"] != "ok":
        return "FAIL"
    s = "%.1f" % float(r["tflops"])
    if pct and r["pct_cublas"] not in ("", "nan", "-1"):
        s += " (%.0f%%)" % float(r["pct_cublas"])
    return s


def main_table(rows):
    shapes = OrderedDict()
    for r in rows:
        if r["section"] == "main":
            shapes.setdefault(shape_label(r), {})[(r["kernel"], r["dtype"], r["math"])] = r
    print("| shape | " + " | ".join(c[0] for c in MAIN_COLUMNS) + " |")
    print("| --- " * (len(MAIN_COLUMNS) + 1) + "|")
    for label, by in shapes.items():
        cells = [cell(by.get((k, d, m)), p) for _, k, d, m, p in MAIN_COLUMNS]
        print("| %s | %s |" % (label, " | ".join(cells)))


def tune_table(rows):
    rows = [r for r in rows if r["section"] == "tune"]
    groups = OrderedDict()
    for r in rows:
        groups.setdefault((r["kernel"] if r["kernel"] != "cublas" else None, r["dtype"], r["math"]),
                          None)
    modes = OrderedDict()
    for r in rows:
        modes.setdefault((r["dtype"], r["math"]), OrderedDict()).setdefault(
            shape_label(r), []).append(r)
    for (dtype, math), by_shape in modes.items():
        shapes = list(by_shape)
        variants = OrderedDict()
        for label, rs in by_shape.items():
            for r in rs:
                name = "cuBLAS" if r["kernel"] == "cublas" else r["variant"]
                variants.setdefault(name, {})[label] = r
        print("\n%s %s: TFLOP/s (%% of cuBLAS); bold: the fastest variant per shape\n" % (dtype, math))
        print("| variant | " + " | ".join(shapes) + " |")
        print("| --- " * (len(shapes) + 1) + "|")
        best = {}
        for label in shapes:
            ok = [(float(r["tflops"]), name) for name, by in variants.items()
                  if name != "cuBLAS" and (r := by.get(label)) and r["status"] == "ok"]
            best[label] = max(ok)[1] if ok else None
        for name, by in variants.items():
            cells = []
            for label in shapes:
                c = cell(by.get(label), name != "cuBLAS")
                cells.append("**%s**" % c if best[label] == name else c)
            print("| %s | %s |" % (name, " | ".join(cells)))


def main():
    args = sys.argv[1:]
    tune = "--tune" in args
    args = [a for a in args if a != "--tune"]
    if len(args) != 1:
        sys.exit("usage: table_kernels.py [--tune] KERNELS.csv")
    rows = list(csv.DictReader(open(args[0])))
    (tune_table if tune else main_table)(rows)


if __name__ == "__main__":
    main()
