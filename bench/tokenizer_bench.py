#!/usr/bin/env python3
"""Tokenizer encode throughput, one thread: kaon vs Hugging Face `tokenizers`, on SmolLM2's
tokenizer (and optionally the fixture tokenizers).

The corpus (several MB) mixes English prose (the license texts under /usr/share/common-licenses),
Python source code (the standard library of the running interpreter) and the multilingual test
corpus of tests/ref/tokenizer_corpus.py. Both sides encode the same lines (split on "\\n", the
newline kept with its line), without special tokens:
  - kaon: `test_tokenizer --bench`, timed inside C (no process start, no file load), best of N.
  - HF: `encode_batch` with TOKENIZERS_PARALLELISM=false (one thread, the per-line loop in Rust),
    and a Python loop of single `encode` calls; best of N.
Usage: python3 bench/tokenizer_bench.py [--build DIR] [--mb 4] [--repeat 3] [--all]
Results: a table on stdout and JSON under bench/results/.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "ref"))
import tokenizer_corpus as tc  # noqa: E402


def build_corpus(mb):
    target = int(mb * 1e6)
    parts = []
    lic = Path("/usr/share/common-licenses")
    prose = b""
    if lic.is_dir():
        for p in sorted(lic.iterdir()):
            if p.is_file():
                prose += p.read_bytes()
    code = b""
    std = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(std.glob("*.py")):
        if len(code) > target * 0.45:
            break
        code += p.read_bytes()
    multi = "\n".join(tc.make_corpus() + tc.training_text()).encode()
    parts = [prose, code, multi]
    data = b""
    i = 0
    while len(data) < target:
        data += parts[i % 3][: max(1, target - len(data))]
        i += 1
    data = data[:target]
    # Keep it valid UTF-8 (HF takes str) and cut at a line end.
    text = data.decode("utf-8", errors="ignore")
    text = text[: text.rfind("\n") + 1]
    return text


def bench_hf(tok, lines, repeat):
    best_batch = best_loop = 1e30
    ntok = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        enc = tok.encode_batch(lines, add_special_tokens=False)
        best_batch = min(best_batch, time.perf_counter() - t0)
        ntok = sum(len(e.ids) for e in enc)
    for _ in range(repeat):
        t0 = time.perf_counter()
        for s in lines:
            tok.encode(s, add_special_tokens=False)
        best_loop = min(best_loop, time.perf_counter() - t0)
    return best_batch, best_loop, ntok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("KAON_BUILD", str(REPO / "build")))
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--all", action="store_true", help="also the fixture tokenizers")
    args = ap.parse_args()
    exe = Path(args.build) / "tests" / "test_tokenizer"
    if not exe.exists():
        sys.exit(f"{exe} not found: build kaon first (or pass --build)")
    from tokenizers import Tokenizer
    text = build_corpus(args.mb)
    raw = text.encode()
    lines = [ln + "\n" for ln in text.split("\n")[:-1]]  # same split as the C side
    corpus_path = REPO / "bench" / "results" / "tmp_tokenizer_corpus.txt"
    corpus_path.parent.mkdir(parents=True, exist_ok=True)
    corpus_path.write_bytes(raw)

    cases = [("SmolLM2 (GGUF)", REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
              lambda: tc.smollm2_reference(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))]
    if args.all:
        fx = REPO / "tests" / "fixtures" / "tokenizers"
        for name in ("llama3", "qwen2", "spm"):
            cases.append((f"{name} fixture", fx / name,
                          lambda n=name: Tokenizer.from_file(str(fx / n / "tokenizer.json"))))
    results = []
    for label, source, make_hf in cases:
        r = subprocess.run([str(exe), "--bench", str(source), str(corpus_path), str(args.repeat)],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            sys.exit(f"kaon bench failed: {r.stderr}")
        k = json.loads(r.stdout.strip().splitlines()[-1])
        hf = make_hf()
        t_batch, t_loop, hf_tokens = bench_hf(hf, lines, args.repeat)
        res = {
            "tokenizer": label, "bytes": len(raw), "lines": len(lines),
            "kaon_tokens": k["tokens"], "hf_tokens": hf_tokens,
            "kaon_mb_s": k["mb_per_s"],
            "hf_encode_batch_mb_s": len(raw) / t_batch / 1e6,
            "hf_encode_loop_mb_s": len(raw) / t_loop / 1e6,
        }
        res["speedup_vs_encode_batch"] = res["kaon_mb_s"] / res["hf_encode_batch_mb_s"]
        res["speedup_vs_encode_loop"] = res["kaon_mb_s"] / res["hf_encode_loop_mb_s"]
        results.append(res)
    corpus_path.unlink()

    print(f"corpus: {len(raw) / 1e6:.2f} MB, {len(lines)} lines; one thread; best of {args.repeat}")
    print(f"{'tokenizer':<18} {'kaon MB/s':>10} {'HF batch MB/s':>14} {'HF loop MB/s':>13} "
          f"{'x batch':>8} {'x loop':>7} {'tokens equal':>13}")
    for r in results:
        print(f"{r['tokenizer']:<18} {r['kaon_mb_s']:>10.2f} {r['hf_encode_batch_mb_s']:>14.2f} "
              f"{r['hf_encode_loop_mb_s']:>13.2f} {r['speedup_vs_encode_batch']:>8.2f} "
              f"{r['speedup_vs_encode_loop']:>7.2f} {str(r['kaon_tokens'] == r['hf_tokens']):>13}")
    out = REPO / "bench" / "results" / f"tokenizer_{datetime.datetime.now():%Y%m%d_%H%M%S}.json"
    import tokenizers
    out.write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                               "cpus": os.cpu_count(), "hf_tokenizers": tokenizers.__version__,
                               "results": results}, indent=1) + "\n")
    print(f"saved {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
