#!/usr/bin/env python3
"""Offline throughput of `kaon generate --device cuda` on dummy bf16 weights: N random prompts of
P tokens, O output tokens each (EOS ignored), all submitted at once with N sequences in flight.

Roofline (as ../shared/ANCHORS.md computes it): each decode step reads the weights its N tokens
touch (bench/roofline.py: for MoE the expected distinct experts of N tokens, nearly all of them
when N is large) plus the KV cache of every sequence (average context P + O/2), at the copy
bandwidth measured in this run; each request's prefill adds 2 x active params x P FLOPs at 790
TFLOP/s.

  python3 bench/gpu_throughput.py --kaon build/kaon --requests 64 --prompt 1024 --output 1024
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_decode import copy_bandwidth  # noqa: E402
import roofline  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kaon", default=str(REPO / "build" / "kaon"))
    ap.add_argument("--config", default=str(REPO / "bench/configs/meta-llama__Llama-3.1-8B.json"))
    ap.add_argument("--requests", type=int, nargs="*", default=[64])
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--output", type=int, default=1024)
    ap.add_argument("--batched-tokens", type=int, default=8192)
    ap.add_argument("--json", default=None)
    ap.add_argument("--tp", type=int, default=1, help="tensor parallel ranks (-tp N: GPUs 0..N-1)")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    ap.add_argument("--max-num-seqs", type=int, default=0, help="sequences in flight at most (default: all requests)")
    a = ap.parse_args()
    cfg = json.loads(Path(a.config).read_text())
    bw = copy_bandwidth() * a.tp  # -tp N reads its weights and KV from N GPUs at once
    import random
    rng = random.Random(0)
    for n in a.requests:
        with tempfile.TemporaryDirectory() as td:
            inp, outp = Path(td) / "in.jsonl", Path(td) / "out.jsonl"
            with open(inp, "w") as f:
                for _ in range(n):
                    ids = [rng.randrange(1000, roofline.text_config(cfg)["vocab_size"] - 1000) for _ in range(a.prompt)]
                    f.write(json.dumps({"prompt_ids": ids}) + "\n")
            cmd = [a.kaon, "generate", "--device", "cuda", "--load-format", "dummy", "-m", a.config,
                   "--input", str(inp), "--output", str(outp), "--max-tokens", str(a.output), "--ignore-eos",
                   "--temp", "0", "--max-num-seqs", str(a.max_num_seqs or n), "--max-num-batched-tokens", str(a.batched_tokens),
                   "--max-model-len", str(a.prompt + a.output + 16), "--quiet", "-tp", str(a.tp),
                   "--kv-cache-dtype", a.kv_cache_dtype]
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
            wall = time.time() - t0
        if p.returncode != 0:
            print(f"kaon generate failed: {p.stderr[-3000:]}")
            continue
        m = re.search(r"generate: (\d+) requests, (\d+) prompt \+ (\d+) generated tokens in ([\d.]+) s", p.stderr)
        gen, secs = int(m.group(3)), float(m.group(4))
        # In flight at once: the requests, capped by --max-num-seqs and by the KV cache the
        # engine planned (its memory plan line); more requests than that run in waves.
        c = min(n, a.max_num_seqs or n)
        cap = re.search(r"KV cache (\d+) blocks x (\d+) tokens", p.stderr)
        if cap:
            c = max(1, min(c, int(cap.group(1)) * int(cap.group(2)) // (a.prompt + a.output)))
        roof = roofline.serving_roofline(cfg, n, c, a.prompt, a.output, bw,
                                         kv_elem=1 if a.kv_cache_dtype == "fp8" else None)
        row = dict(kind="throughput", config=Path(a.config).name, tp=a.tp, requests=n, in_flight=c,
                   kv_cache_dtype=a.kv_cache_dtype, prompt=a.prompt, output=a.output,
                   generated=gen, seconds=secs, output_tok_s=gen / secs, roofline_tok_s=roof,
                   roofline_fraction=gen / secs / roof, wall_s=wall, copy_bw_TBs=bw / 1e12,
                   stats=[l for l in p.stderr.splitlines() if l.startswith("kaon-stats")][-1:],
                   plan=[l for l in p.stderr.splitlines() if "memory plan" in l][-1:])
        print(json.dumps(row))
        print(f"{n} requests ({c} in flight): {gen / secs:.0f} output tok/s, roofline {roof:.0f}, "
              f"fraction {gen / secs / roof * 100:.1f}% (wall {wall:.1f} s)")
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(dict(row, date=time.strftime("%Y-%m-%d %H:%M"))) + "\n")


if __name__ == "__main__":
    main()
