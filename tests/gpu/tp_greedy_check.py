#!/usr/bin/env python3
"""Greedy ids of -tp N against -tp 1 on the same dummy weights of a real config (issue 19's first
check: Llama-3.1-8B bf16 on two GPUs). Dummy weights are seeded per whole tensor, so every
layout holds the same numbers (a rank's shard is its slice of what one GPU would create).

Requests run batched as a server would (all submitted at once). Where a sequence parts from one
GPU's, the one-GPU logits at that point are read (`kaon logits --load-format dummy`) and the gap
between the two tokens printed: the row-parallel sums' order differs between layouts, so only
near-ties may part. Exits 1 when a sequence parts at a gap above --tie.

  python3 tests/gpu/tp_greedy_check.py --kaon build-gpu/kaon --tp 2 [--config C] [--prompts 16 --tokens 64]
      [--launcher "mpirun -np 2 --bind-to none"]   (-tp N as a multi-node job of that many processes)
"""
import argparse
import json
import random
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def generate(a, prompts, tp, tmp):
    inp, out = tmp / f"in-{tp}.jsonl", tmp / f"out-{tp}.jsonl"
    inp.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
    cmd = [a.kaon, "generate", "--device", "cuda", "--load-format", "dummy", "-m", a.config, "--input", str(inp),
           "--output", str(out), "--quiet", "--temp", "0", "--max-tokens", str(a.tokens), "--ignore-eos",
           "-tp", str(tp)]
    if tp > 1 and a.launcher:
        cmd = shlex.split(a.launcher) + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if r.returncode:
        sys.exit(f"tp {tp}: {r.stderr[-3000:]}")
    return [json.loads(l)["token_ids"] for l in out.read_text().splitlines()]


def gap(a, ids, x, y, tmp):
    out = tmp / "l.f32"
    cmd = [a.kaon, "logits", "--device", "cuda", "--load-format", "dummy", "-m", a.config, "--prompt-ids",
           ",".join(map(str, ids)), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode:
        print(f"  (no one-GPU logits: {r.stderr.strip()[-300:]})")
        return None
    l = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)[-1]
    srt = np.sort(l)
    print(f"  one GPU's logits there: top-2 gap {srt[-1] - srt[-2]:.4g}, |logit {x} - logit {y}| = "
          f"{abs(float(l[x]) - float(l[y])):.4g} (logit std {float(l.std()):.3g})")
    return abs(float(l[x]) - float(l[y]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kaon", default=str(REPO / "build-gpu" / "kaon"))
    ap.add_argument("--config", default=str(REPO / "bench/configs/meta-llama__Llama-3.1-8B.json"))
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tie", type=float, default=0.05, help="largest logit gap a parting may have")
    ap.add_argument("--launcher", default="", help="a prefix for the -tp N run (mpirun ...): a multi-node job")
    a = ap.parse_args()
    rng = random.Random(19)
    prompts = [[rng.randrange(100, 30000) for _ in range(rng.randrange(8, 200))] for _ in range(a.prompts)]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        one, many = generate(a, prompts, 1, tmp), generate(a, prompts, a.tp, tmp)
        parted, bad = 0, 0
        for i, (p, x, y) in enumerate(zip(prompts, one, many)):
            if x == y:
                continue
            k = next((j for j in range(min(len(x), len(y))) if x[j] != y[j]), min(len(x), len(y)))
            parted += 1
            print(f"sequence {i}: parts at token {k} of {len(x)} ({x[k] if k < len(x) else None} vs "
                  f"{y[k] if k < len(y) else None})")
            g = gap(a, p + x[:k], x[k], y[k], tmp) if k < min(len(x), len(y)) else None
            if g is None or g > a.tie:
                bad += 1
        tokens = sum(len(x) for x in one)
        same = sum(sum(1 for s, t in zip(x, y) if s == t) if x == y else
                   next((j for j in range(len(x)) if x[j] != y[j]), len(x)) for x, y in zip(one, many))
        print(f"TP {a.tp} vs TP 1 ({Path(a.config).name}, dummy weights): {a.prompts - parted} of {a.prompts} "
              f"sequences equal, {parted} parted ({bad} not at a near-tie <= {a.tie}); {same} of {tokens} "
              f"tokens before the partings")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
