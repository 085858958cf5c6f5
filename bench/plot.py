#!/usr/bin/env python3
"""Plots of serving-benchmark sweeps (results of bench/serve.py), one or several servers together.

    python3 bench/plot.py bench/results/serve-kaon-*.json bench/results/serve-llamacpp-*.json \\
        --out-dir docs/perf --prefix kaon-vs-llamacpp-

Writes PNGs (matplotlib, Agg backend):
  throughput.png      output tokens/s (solid) and total tokens/s (dashed) vs max concurrency
  ttft.png, tpot.png  median, p90 and p99 vs max concurrency (log scale)
  interactivity.png   output tokens/s per GPU vs tokens/s per user (1000 / median TPOT): the
                      throughput-vs-interactivity curve; each point is labelled with its concurrency
  summary.png         the four in one figure
Each input file is one series, named by its `label` (--labels overrides).
"""
import argparse
import json
from pathlib import Path


def load(path):
    res = json.loads(Path(path).read_text())
    if "runs" not in res:  # a flat vLLM result file: one run
        res = {**res, "runs": [res]}
    return res


def _runs(res):
    rs = [r for r in res["runs"] if r.get("completed")]
    return sorted(rs, key=lambda r: r.get("max_concurrency") or 1 << 30)


def _conc(r):
    return r.get("max_concurrency") or r.get("max_concurrent_requests") or 0


def _pct_keys(res, metric):
    keys = [("median", f"median_{metric}_ms", "-")]
    for p, style in (("90", "--"), ("99", ":")):
        if any(f"p{p}_{metric}_ms" in r for r in res["runs"]):
            keys.append((f"p{p}", f"p{p}_{metric}_ms", style))
    return keys


def _title(results):
    r = results[0]
    parts = [str(r.get("model", ""))]
    if r.get("random_input_len"):
        parts.append(f"in {r['random_input_len']} / out {r['random_output_len']} tokens")
    return ", ".join(p for p in parts if p)


def _draw(ax, kind, results, labels):
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
    for i, (res, label) in enumerate(zip(results, labels)):
        c = colors[i % len(colors)]
        rs = _runs(res)
        if not rs:
            continue
        xs = [_conc(r) for r in rs]
        if kind == "throughput":
            ax.plot(xs, [r["output_throughput"] for r in rs], "o-", color=c, label=f"{label} output")
            ax.plot(xs, [r["total_token_throughput"] for r in rs], "s--", color=c, alpha=0.6, label=f"{label} total")
            ax.set_ylabel("tokens/s")
        elif kind in ("ttft", "tpot"):
            for name, key, style in _pct_keys(res, kind):
                ax.plot(xs, [r.get(key, 0) or float("nan") for r in rs], "o" + style, color=c, label=f"{label} {name}")
            ax.set_ylabel(f"{kind.upper()} (ms)")
            ax.set_yscale("log")
        elif kind == "interactivity":
            ngpu = max(int(res.get("num_gpus") or 1), 1)
            pts = [(1000.0 / r["median_tpot_ms"], r["output_throughput"] / ngpu, _conc(r))
                   for r in rs if r.get("median_tpot_ms")]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=c, label=label)
            for x, y, n in pts:
                ax.annotate(str(n), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8, color=c)
            ax.set_xlabel("tokens/s per user (1000 / median TPOT)")
            ax.set_ylabel("output tokens/s per GPU")
        if kind != "interactivity":
            ax.set_xscale("log", base=2)
            ax.set_xlabel("max concurrency")
            ax.set_xticks(sorted({_conc(r) for res2 in results for r in _runs(res2)}))
            ax.get_xaxis().set_major_formatter(__import__("matplotlib.ticker", fromlist=["x"]).ScalarFormatter())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


TITLES = {"throughput": "Throughput vs concurrency", "ttft": "Time to first token",
          "tpot": "Time per output token", "interactivity": "Throughput vs interactivity"}


def plot_results(results, out_dir, prefix="", labels=None):
    """Writes the PNGs for results (loaded result dicts); returns their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = labels or [r.get("label") or f"server {i + 1}" for i, r in enumerate(results)]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sub = _title(results)
    paths = []
    for kind in ("throughput", "ttft", "tpot", "interactivity"):
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
        _draw(ax, kind, results, labels)
        ax.set_title(f"{TITLES[kind]}\n{sub}", fontsize=10)
        fig.tight_layout()
        p = out_dir / f"{prefix}{kind}.png"
        fig.savefig(p)
        plt.close(fig)
        paths.append(p)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9), dpi=90)
    for ax, kind in zip(axes.flat, ("throughput", "interactivity", "ttft", "tpot")):
        _draw(ax, kind, results, labels)
        ax.set_title(TITLES[kind], fontsize=10)
    fig.suptitle(f"{' vs '.join(labels)}: {sub}", fontsize=11)
    fig.tight_layout()
    p = out_dir / f"{prefix}summary.png"
    fig.savefig(p)
    plt.close(fig)
    paths.append(p)
    return paths


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="result JSON files of bench/serve.py")
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--prefix", default="", help="file name prefix of the PNGs")
    ap.add_argument("--labels", default=None, help="comma-separated series names (default: each file's label)")
    a = ap.parse_args()
    results = [load(p) for p in a.results]
    labels = a.labels.split(",") if a.labels else None
    for p in plot_results(results, a.out_dir, a.prefix, labels):
        print(p)


if __name__ == "__main__":
    main()
