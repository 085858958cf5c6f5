#!/usr/bin/env python3
"""Builds the performance dashboard docs/perf/index.html from the result files in bench/results/.

    python3 bench/dashboard.py                      # bench/results -> docs/perf/index.html
    python3 bench/dashboard.py --results DIR --out OUT.html --png-dir DIR

The page is one static file: no CDN, no JavaScript, nothing fetched. It shows
  - the latest figures of every serving workload (bench/serve.py results), server by server;
  - each metric's history over commits (inline SVG line charts, one line per server and
    concurrency): output and request throughput, TTFT, TPOT, ITL, E2E latency, failures;
  - the offline benchmarks' history (`kaon bench throughput`, `kaon bench latency`);
  - the latest sweep of each workload as PNG plots (bench/plot.py; every server's latest sweep
    of that workload in one plot), embedded in the page and also written under --png-dir.
Every figure names the date, commit, machine and command it came from.
"""
import argparse
import base64
import datetime
import html
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

SERVE_METRICS = [
    ("output_throughput", "Output throughput", "tokens/s", True),
    ("request_throughput", "Request throughput", "requests/s", True),
    ("median_ttft_ms", "Median TTFT", "ms", False),
    ("p99_ttft_ms", "P99 TTFT", "ms", False),
    ("median_tpot_ms", "Median TPOT", "ms", False),
    ("p99_tpot_ms", "P99 TPOT", "ms", False),
    ("median_itl_ms", "Median ITL", "ms", False),
    ("median_e2el_ms", "Median E2E latency", "ms", False),
    ("failed", "Failed requests", "requests", False),
]
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
          "#7f7f7f", "#bcbd22"]
E = html.escape


def load_results(d):
    """Every result file of the known kinds, oldest first: list of (path, dict)."""
    out = []
    for p in sorted(Path(d).glob("*.json")):
        try:
            j = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(j, dict):
            continue
        kind = j.get("benchmark")
        if kind is None and "runs" in j and "endpoint" in j:
            kind = "serve"
        if kind in ("serve", "throughput", "latency"):
            j["benchmark"] = kind
            j["_file"] = p.name
            out.append((p, j))
    out.sort(key=lambda pj: (str(pj[1].get("date", "")), pj[0].name))
    return out


def workload(r):
    """The serving workload a result measured (results of one workload are comparable)."""
    model = Path(str(r.get("model", "?"))).name  # servers name one file differently (path, file name)
    model = model[:-5] if model.endswith(".gguf") else model
    return (model, r.get("endpoint", "/v1/completions"), r.get("random_input_len"),
            r.get("random_output_len"), r.get("random_prefix_len") or 0)


def workload_name(w):
    model, ep, lin, lout, prefix = w
    s = f"{model}, {ep}, in {lin} / out {lout} tokens"
    return s + (f", shared prefix {prefix}" if prefix else "")


def slug(s):
    return re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-")[:80]


def when(r):
    return f"{str(r.get('date', '?'))[:16]} {r.get('commit') or '?'}"


# ---- inline SVG line chart --------------------------------------------------------------------

def _nice_ticks(lo, hi, n=5):
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** int(f"{raw:e}".split("e")[1])
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    t = (lo // step) * step
    ticks = [t]
    while ticks[-1] < hi - step * 1e-9:  # the last tick is at or above hi: every point fits
        ticks.append(ticks[-1] + step)
    return ticks


def _fmt(v):
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.1f}"
    return f"{v:.3g}"


def svg_chart(title, unit, xs, series, metric_id):
    """xs: x labels (each a point in time); series: [(name, {x_index: (value, tooltip)})]."""
    W, H, L, R, T, B = 660, 290, 60, 170, 28, 58
    pw, ph = W - L - R, H - T - B
    vals = [v for _, pts in series for v, _ in pts.values()]
    hi = max(vals) if vals else 1.0
    ticks = _nice_ticks(0.0, hi * 1.05 if hi > 0 else 1.0)
    top = ticks[-1] if ticks[-1] > 0 else 1.0
    n = max(len(xs), 1)

    def X(i):
        return L + (pw * (i + 0.5) / n)

    def Y(v):
        return T + ph - ph * v / top
    o = [f'<svg class="chart" data-metric="{E(metric_id)}" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         f'role="img" aria-label="{E(title)}">',
         f'<text x="{L}" y="18" class="t">{E(title)} ({E(unit)})</text>']
    for t in ticks:
        y = Y(t)
        o.append(f'<line x1="{L}" y1="{y:.1f}" x2="{L + pw}" y2="{y:.1f}" class="grid"/>')
        o.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end" class="ax">{_fmt(t)}</text>')
    o.append(f'<line x1="{L}" y1="{T + ph}" x2="{L + pw}" y2="{T + ph}" class="axis"/>')
    o.append(f'<line x1="{L}" y1="{T}" x2="{L}" y2="{T + ph}" class="axis"/>')
    step = max(1, (n + 11) // 12)
    for i, lab in enumerate(xs):
        if i % step == 0 or i == n - 1:
            x = X(i)
            o.append(f'<text x="{x:.1f}" y="{T + ph + 14}" text-anchor="end" class="ax" '
                     f'transform="rotate(-30 {x:.1f} {T + ph + 14})">{E(lab)}</text>')
    for k, (name, pts) in enumerate(series):
        c = COLORS[k % len(COLORS)]
        idx = sorted(pts)
        if len(idx) > 1:
            path = " ".join(f"{X(i):.1f},{Y(pts[i][0]):.1f}" for i in idx)
            o.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        for i in idx:
            v, tip = pts[i]
            o.append(f'<circle cx="{X(i):.1f}" cy="{Y(v):.1f}" r="3.5" fill="{c}"><title>{E(tip)}</title></circle>')
        ly = T + 4 + 16 * k
        o.append(f'<rect x="{L + pw + 12}" y="{ly}" width="10" height="10" fill="{c}"/>')
        o.append(f'<text x="{L + pw + 27}" y="{ly + 9}" class="lg">{E(name[:28])}</text>')
    o.append("</svg>")
    return "".join(o)


def history_charts(items, metrics, key_of_series, label_of_series, value_of, max_series=10):
    """items: [(result, run)] oldest first. One chart per metric, one line per series key."""
    # x: one point per commit (results without a commit: per date), in the order first measured
    def xkey(r):
        return r.get("commit") or str(r.get("date", "?"))
    first = {}
    for r, _ in items:
        k = xkey(r)
        first[k] = min(first.get(k, "~"), str(r.get("date", "")))
    order = sorted(first, key=lambda k: (first[k], k))
    xindex = {k: i for i, k in enumerate(order)}
    xs = [f"{first[k][5:10]} {k}" if first[k] and k != first[k] else k[:16] for k in order]
    by_series = defaultdict(list)
    for r, run in items:
        by_series[key_of_series(r, run)].append((r, run))
    # the series measured most recently first
    keys = sorted(by_series, key=lambda k: max(str(r.get("date", "")) for r, _ in by_series[k]), reverse=True)[:max_series]
    charts = []
    for mid, title, unit, _ in metrics:
        series = []
        for k in keys:
            pts = {}
            for r, run in by_series[k]:
                v = value_of(r, run, mid)
                if v is None:
                    continue
                i = xindex[xkey(r)]
                pts[i] = (float(v), f"{label_of_series(k)}: {_fmt(float(v))} {unit} — {when(r)}, {r.get('machine', '?')}")
            if pts:
                series.append((label_of_series(k), pts))
        if series:
            charts.append((mid, title, svg_chart(title, unit, xs, series, mid)))
    return charts


# ---- the page ---------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1500px;color:#222;padding:0 16px}
h1{font-size:24px;margin-bottom:4px} h2{font-size:19px;margin-top:36px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:22px 0 6px} p.meta,figcaption,.small{color:#555;font-size:12.5px}
table{border-collapse:collapse;font-size:13px;margin:8px 0} th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4} td.l,th.l{text-align:left} code{font-size:12px;background:#f6f6f6;padding:1px 3px;word-break:break-all}
.grid-charts{display:flex;flex-wrap:wrap;gap:12px} figure{margin:0;border:1px solid #eee;padding:6px;background:#fff}
svg.chart text.t{font-size:13px;font-weight:600} svg.chart text.ax{font-size:10px;fill:#555} svg.chart text.lg{font-size:11px}
svg.chart line.grid{stroke:#eee} svg.chart line.axis{stroke:#888} img.plot{width:600px;max-width:100%;height:auto}
figure.sweep{width:604px} figure.history{width:662px}
.bad{color:#b00;font-weight:600}
"""


def _img(path):
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def serve_section(serve, png_dir):
    out = []
    groups = defaultdict(list)
    for r in serve:
        groups[workload(r)].append(r)
    out.append("<h2 id=\"serving\">Serving (bench/serve.py)</h2>")
    out.append('<p class="small">Client-side metrics as vLLM defines them: TTFT to the first streamed chunk, '
               "TPOT = (E2E − TTFT) / (output tokens − 1), ITL between chunks, output tokens from the "
               "server's usage. Hover a point for its date, commit and machine.</p>")
    for gi, (w, rs) in enumerate(sorted(groups.items(), key=lambda kv: max(str(r.get("date")) for r in kv[1]), reverse=True)):
        out.append(f'<h3 class="workload">{E(workload_name(w))}</h3>')
        latest = {}
        for r in rs:
            latest[r.get("label", "?")] = r  # oldest first: the last one wins
        out.append("<table><tr><th class=l>server</th><th class=l>date, commit</th><th>conc.</th><th>req/s</th>"
                   "<th>out tok/s</th><th>TTFT med (ms)</th><th>TTFT p99</th><th>TPOT med (ms)</th><th>TPOT p99</th>"
                   "<th>ITL med (ms)</th><th>E2E med (ms)</th><th>ok</th><th>failed</th></tr>")
        for label, r in sorted(latest.items()):
            for run in r["runs"]:
                bad = ' class="bad"' if run.get("failed") else ""
                c = run.get("max_concurrency")
                out.append(f"<tr><td class=l>{E(label)}</td><td class=l>{E(when(r))}</td><td>{c if c else 'inf'}</td>"
                           f"<td>{run['request_throughput']:.2f}</td><td>{run['output_throughput']:.1f}</td>"
                           f"<td>{run.get('median_ttft_ms', 0):.1f}</td><td>{run.get('p99_ttft_ms', 0):.1f}</td>"
                           f"<td>{run.get('median_tpot_ms', 0):.2f}</td><td>{run.get('p99_tpot_ms', 0):.2f}</td>"
                           f"<td>{run.get('median_itl_ms', 0):.2f}</td><td>{run.get('median_e2el_ms', 0):.1f}</td>"
                           f"<td>{run['completed']}</td><td{bad}>{run['failed']}</td></tr>")
        out.append("</table>")
        for label, r in sorted(latest.items()):
            out.append(f'<p class="meta">{E(label)}: {E(when(r))} on {E(str(r.get("machine", "?")))}; '
                       f'<code>{E(str(r.get("command", "")))}</code></p>')
        sweeps = [r for r in latest.values() if len(r["runs"]) > 1]
        if sweeps and png_dir is not None:
            try:
                import plot
                name = slug(f"sweep-{w[0]}-in{w[2]}-out{w[3]}" + (f"-prefix{w[4]}" if w[4] else "")
                            + ("-chat" if "chat" in w[1] else ""))
                pngs = plot.plot_results(sorted(sweeps, key=lambda r: r.get("label", "")), png_dir, name + "-")
                out.append('<div class="grid-charts">')
                for p in pngs:
                    if p.name.endswith("summary.png"):
                        continue
                    out.append(f'<figure class="sweep"><img class="plot" alt="{E(p.stem)}" src="{_img(p)}">'
                               f"<figcaption>{E(p.name)} — latest sweep of each server "
                               f"({E(', '.join(when(r) for r in sweeps))})</figcaption></figure>")
                out.append("</div>")
            except ImportError as e:
                out.append(f'<p class="bad">no sweep plots: {E(str(e))} (pip install matplotlib)</p>')
        items = [(r, run) for r in rs for run in r["runs"]]
        charts = history_charts(
            items, SERVE_METRICS,
            key_of_series=lambda r, run: (r.get("label", "?"), run.get("max_concurrency") or 0),
            label_of_series=lambda k: f"{k[0]} c={k[1] if k[1] else 'inf'}",
            value_of=lambda r, run, m: run.get(m))
        out.append('<div class="grid-charts">')
        for mid, title, svg in charts:
            out.append(f'<figure class="history" data-group="{gi}">{svg}<figcaption>{E(title)} over commits</figcaption></figure>')
        out.append("</div>")
    return out


def offline_section(tp, lat):
    out = []
    if tp:
        out.append('<h2 id="throughput">Offline throughput (kaon bench throughput)</h2>')
        charts = history_charts(
            [(r, r) for r in tp],
            [("output_tokens_per_second", "Output tokens/s", "tokens/s", True),
             ("requests_per_second", "Requests/s", "requests/s", True)],
            key_of_series=lambda r, _: (r.get("model"), r.get("device"), r.get("input_len"), r.get("output_len"), r.get("num_requests")),
            label_of_series=lambda k: f"{k[0]} {k[1]} {k[2]}/{k[3]} x{k[4]}",
            value_of=lambda r, _, m: r.get(m))
        out.append('<div class="grid-charts">')
        out += [f'<figure class="history">{svg}<figcaption>{E(t)} over commits</figcaption></figure>' for _, t, svg in charts]
        out.append("</div>")
        r = tp[-1]
        out.append(f'<p class="meta">latest: {E(when(r))} on {E(str(r.get("machine")))}; <code>{E(str(r.get("command")))}</code></p>')
    if lat:
        out.append('<h2 id="latency">Offline latency (kaon bench latency)</h2>')
        items = [(r, run) for r in lat for run in r.get("results", [])]
        charts = history_charts(
            items,
            [("avg_decode_step_ms", "Decode step time", "ms", False), ("avg_latency", "Batch latency", "s", False)],
            key_of_series=lambda r, run: (r.get("model"), r.get("device"), run.get("batch_size")),
            label_of_series=lambda k: f"{k[0]} {k[1]} batch {k[2]}",
            value_of=lambda r, run, m: run.get(m))
        out.append('<div class="grid-charts">')
        out += [f'<figure class="history">{svg}<figcaption>{E(t)} over commits</figcaption></figure>' for _, t, svg in charts]
        out.append("</div>")
        r = lat[-1]
        out.append(f'<p class="meta">latest: {E(when(r))} on {E(str(r.get("machine")))}; <code>{E(str(r.get("command")))}</code></p>')
    return out


def build(results_dir, out_html, png_dir):
    res = load_results(results_dir)
    serve = [r for _, r in res if r["benchmark"] == "serve" and r.get("runs")]
    tp = [r for _, r in res if r["benchmark"] == "throughput"]
    lat = [r for _, r in res if r["benchmark"] == "latency"]
    out_html = Path(out_html)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now().isoformat(timespec="seconds")
    body = [f"<h1>kaon performance</h1>",
            f'<p class="meta">Built {E(now)} by <code>bench/dashboard.py</code> from {len(res)} result files in '
            f"<code>{E(str(results_dir))}</code>. Every figure carries its date, commit, machine and command; the "
            "tools run against any OpenAI-compatible server (see docs/PERF.md).</p>",
            '<p class="small"><a href="#serving">serving</a> · <a href="#throughput">offline throughput</a> · '
            '<a href="#latency">offline latency</a></p>']
    if not res:
        body.append("<p>No results yet: run <code>kaon bench serve</code> and save under bench/results/.</p>")
    if serve:
        body += serve_section(serve, Path(png_dir) if png_dir else None)
    body += offline_section(tp, lat)
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>kaon performance</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
    out_html.write_text(page)
    return out_html


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(REPO / "bench" / "results"))
    ap.add_argument("--out", default=str(REPO / "docs" / "perf" / "index.html"))
    ap.add_argument("--png-dir", default=None, help="where the sweep PNGs go (default: next to --out)")
    a = ap.parse_args()
    p = build(a.results, a.out, a.png_dir or Path(a.out).parent)
    print(p)


if __name__ == "__main__":
    main()
