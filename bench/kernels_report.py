#!/usr/bin/env python3
"""kernels_report.py - Markdown tables (and a plot) from bench_kernels' CSV files.

    python3 bench/kernels_report.py KERNELS.csv                   # TFLOP/s per member and shape, % of cuBLAS
    python3 bench/kernels_report.py --tune TUNE.csv               # the tuning sweep: variants per shape
    python3 bench/kernels_report.py --plot OUT.png KERNELS.csv    # also bar charts (needs matplotlib)
    python3 bench/kernels_report.py --base OLD1.csv,OLD2.csv NEW1.csv NEW2.csv
                                    # two builds timed in alternating rounds: median TFLOP/s of each, new / old

Only rows whose check passed are shown as figures; a failed check prints FAIL in its cell.
"""
import argparse
import csv
import statistics
from collections import OrderedDict

# (column title, kernel, dtype, math, with % of cuBLAS)
MAIN_COLUMNS = [
    ("cuBLAS fp32", "cublas", "float32", "fp32", False), ("simt", "simt", "float32", "fp32", True),
    ("naive", "naive", "float32", "fp32", False), ("tiled", "tiled", "float32", "fp32", False),
    ("cuBLAS tf32", "cublas", "float32", "tf32", False), ("mma tf32", "mma", "float32", "tf32", True),
    ("wgmma tf32", "wgmma", "float32", "tf32", True), ("cuBLAS bf16*", "cublas", "float32", "bf16", False),
    ("mma bf16", "mma", "float32", "bf16", True), ("wgmma bf16", "wgmma", "float32", "bf16", True),
    ("cuBLAS f64", "cublas", "float64", "exact", False), ("dmma", "dmma", "float64", "exact", True),
    ("simt f64", "simt", "float64", "exact", True), ("int32 simt", "simt", "int32", "exact", False),
    ("int32 tiled", "tiled", "int32", "exact", False),
]
PLOT_MODES = [("float32", "fp32"), ("float32", "tf32"), ("float32", "bf16"), ("float64", "exact"), ("int32", "exact")]
ORDER = ["naive", "tiled", "simt", "mma", "dmma", "wgmma", "cublas"]
COLORS = {"naive": "#bbbbbb", "tiled": "#888888", "simt": "#2ca02c", "mma": "#1f77b4", "dmma": "#d62728",
          "wgmma": "#9467bd", "cublas": "#ff7f0e"}


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
        print("| %s | %s |" % (label, " | ".join(cell(by.get((k, d, m)), p) for _, k, d, m, p in MAIN_COLUMNS)))


def tune_table(rows):
    modes = OrderedDict()
    for r in rows:
        if r["section"] == "tune":
            modes.setdefault((r["dtype"], r["math"]), OrderedDict()).setdefault(shape_label(r), []).append(r)
    for (dtype, math), by_shape in modes.items():
        shapes, variants = list(by_shape), OrderedDict()
        for label, rs in by_shape.items():
            for r in rs:
                variants.setdefault("cuBLAS" if r["kernel"] == "cublas" else r["variant"], {})[label] = r
        print("\n%s %s: TFLOP/s (%% of cuBLAS); bold: the fastest variant per shape\n" % (dtype, math))
        print("| variant | " + " | ".join(shapes) + " |")
        print("| --- " * (len(shapes) + 1) + "|")
        best = {}
        for label in shapes:
            ok = [(float(r["tflops"]), name) for name, by in variants.items()
                  if name != "cuBLAS" and (r := by.get(label)) and r["status"] == "ok"]
            best[label] = max(ok)[1] if ok else None
        for name, by in variants.items():
            cells = [cell(by.get(label), name != "cuBLAS") for label in shapes]
            cells = ["**%s**" % c if best[s] == name else c for c, s in zip(cells, shapes)]
            print("| %s | %s |" % (name, " | ".join(cells)))


def compare(old_files, new_files):
    """Median TFLOP/s per (kernel, variant, dtype, math, shape) of each build, and new / old."""
    runs = {}
    for which, files in (("old", old_files), ("new", new_files)):
        for f in files:
            for r in csv.DictReader(open(f)):
                if r["status"] == "ok":
                    key = "%s %s %s %s %s" % (r["kernel"], r["variant"], r["dtype"], r["math"], shape_label(r))
                    runs.setdefault(key, {"old": [], "new": []})[which].append(float(r["tflops"]))
    print("| kernel variant dtype math shape | old TFLOP/s | new TFLOP/s | new / old |\n| --- | ---: | ---: | ---: |")
    for key, v in runs.items():
        if v["old"] and v["new"]:
            o, n = statistics.median(v["old"]), statistics.median(v["new"])
            print("| %s | %.2f | %.2f | %.3f |" % (key, o, n, n / o if o else 0))


def plot(rows, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r["section"] == "main" and r["status"] == "ok"]
    fig, axes = plt.subplots(len(PLOT_MODES), 1, figsize=(13, 4.2 * len(PLOT_MODES)))
    for ax, (dtype, math) in zip(axes, PLOT_MODES):
        sel = [r for r in rows if r["dtype"] == dtype and r["math"] == math]
        shapes = list(OrderedDict((shape_label(r), None) for r in sel))
        kernels = [k for k in ORDER if any(r["kernel"] == k for r in sel)]
        kernels += sorted({r["kernel"] for r in sel} - set(kernels))
        width = 0.8 / max(1, len(kernels))
        for i, kname in enumerate(kernels):
            vals = [next((float(r["tflops"]) for r in sel if r["kernel"] == kname and shape_label(r) == s), 0.0)
                    for s in shapes]
            ax.bar([j + (i - (len(kernels) - 1) / 2) * width for j in range(len(shapes))], vals, width, label=kname,
                   color=COLORS.get(kname), hatch="//" if kname == "cublas" else None, edgecolor="black",
                   linewidth=0.4)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, rotation=20, fontsize=8)
        ax.set_ylabel("TFLOP/s" if dtype != "int32" else "TOP/s")
        ax.set_title("%s %s" % (dtype, "" if math == "exact" else "math=" + math))
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, ncol=len(kernels))
    device = rows[0]["device"] if rows else "?"
    fig.suptitle("gemmd kernel family vs cuBLAS - %s (median of repeats, L2 flushed)" % device)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(out, dpi=90)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--plot", metavar="OUT.png")
    ap.add_argument("--base", help="comma list of the old build's CSVs: compare the CSVs given with them")
    a = ap.parse_args()
    if a.base:
        return compare(a.base.split(","), a.csv)
    rows = [r for f in a.csv for r in csv.DictReader(open(f))]
    (tune_table if a.tune else main_table)(rows)
    if a.plot:
        plot(rows, a.plot)


if __name__ == "__main__":
    main()
