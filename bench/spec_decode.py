#!/usr/bin/env python3
"""Batch-1 decode speed with speculative decoding, against the same run without it.

Runs `kaon run` once plainly (greedy, its ids recorded), then with the oracle proposer replaying
those ids (every draft accepted: with k drafts a verify step emits k + 1 tokens, so k = 2 is
acceptance length 3) for each k asked, then with the n-gram proposer on a prompt that repeats a
motif. Checks that every run's ids equal the plain run's (greedy identity; where a run parts
from it, the plain run's top-2 logit gap at that position, from `kaon logits --decode`, says
whether it is a near-tie), prints one JSON line per run and a table, and saves them to
bench/results/spec-<device>-<date>.json.

  python3 bench/spec_decode.py --kaon build/kaon                       # CPU, the default model
  python3 bench/spec_decode.py --kaon build-gpu/kaon --device cuda \\
      --config bench/configs/meta-llama__Llama-3.1-8B.json --tokens 256  # dummy weights on a GPU

--method mtp (a DeepSeek-V3 config or checkpoint with num_nextn_predict_layers): besides the
oracle runs, the MTP layer drafts for each k, once as it is (real acceptance; greedy identity
checked) and once with force_accept (benchmarks only: every draft kept unverified, so the
output is not the model's): the speed at acceptance length k + 1 with the draft model's passes
paid, against the oracle's (the verify alone) at the same k.
  python3 bench/spec_decode.py --kaon build-gpu/kaon --device cuda --method mtp \\
      --config <a DeepSeek-V3 config.json, e.g. fewer layers> --tokens 256 --k 1,2,3

--method eagle3 --head H (an EAGLE-3 head's folder, or its config.json alone for a dummy head
under --config): the same two runs per k with the head drafting.
  python3 bench/spec_decode.py --kaon build/kaon --device cuda --method eagle3 \\
      --config bench/configs/meta-llama__Llama-3.1-8B-Instruct.json \\
      --head bench/configs/sgl-project__SpecForge__llama3-8B-eagle3.json --tokens 256 --k 1,2,3,4
"""
import argparse
import atexit
import json
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEED = re.compile(r"generated (\d+) tokens, ([\d.]+) tok/s")
SPEC = re.compile(r"speculative: (\d+) verify steps, (\d+) of (\d+) drafts accepted, ([\d.]+) tokens per verify step")


def run(a, prompt, spec=None):
    cmd = [a.kaon, "run", "--device", a.device, "--prompt-ids", ",".join(map(str, prompt)), "-n", str(a.tokens),
           "--temp", "0", "--ignore-eos", "--print-ids"]
    cmd += ["--load-format", "dummy", "-m", a.config] if a.config else ["-m", a.model] if a.model else []
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    if spec:
        cmd += ["--speculative-config", json.dumps(spec)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode:
        raise RuntimeError(f"kaon failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    m = SPEED.search(p.stderr)
    row = dict(generated=int(m.group(1)), decode_tok_s=float(m.group(2)), ids=json.loads(p.stdout.strip().splitlines()[-1]))
    s = SPEC.search(p.stderr)
    if s:
        row.update(verify_steps=int(s.group(1)), accepted=int(s.group(2)), drafted=int(s.group(3)),
                   acceptance_length=float(s.group(4)))
    return row


def top2_gap(a, ids):
    """The top two logits after ids (decoded one token at a time, as the plain run did)."""
    import numpy as np
    with tempfile.TemporaryDirectory() as td:
        out = Path(td) / "logits.f32"
        model = f"dummy:{a.config}" if a.config else (a.model or "")
        cmd = [a.kaon, "logits", "--device", a.device, "--prompt-ids", ",".join(map(str, ids)), "-o", str(out),
               "--decode"] + (["-m", model] if model else [])
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if p.returncode:
            return None
        x = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)[-1]
    top = np.sort(x)[-2:]
    return dict(top1=float(top[1]), top2=float(top[0]), gap=float(top[1] - top[0]),
                relative_gap=float((top[1] - top[0]) / max(abs(top[1]), 1e-9)))


def parting(a, prompt, plain_ids, ids):
    """Where ids part from plain_ids, and the plain run's top-2 gap there."""
    d = next((i for i, (x, y) in enumerate(zip(plain_ids, ids)) if x != y), None)
    if d is None:
        return {}
    return dict(parts_at=d, gap_there=top2_gap(a, prompt + plain_ids[:d]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kaon", default=str(REPO / "build" / "kaon"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--config", help="a config.json: dummy weights (GPU runs)")
    ap.add_argument("--model", help="a model file or folder (default: kaon's default model)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--k", default="1,2,3", help="oracle draft counts (acceptance length k + 1)")
    ap.add_argument("--ngram-k", type=int, default=4)
    ap.add_argument("--method", default="oracle", choices=["oracle", "mtp", "eagle3"],
                    help="mtp / eagle3: also the draft model, as it is and at forced acceptance")
    ap.add_argument("--head", help="eagle3: the head's folder, or its config.json (a dummy head under --config)")
    ap.add_argument("--reps", type=int, default=1, help="runs of each variant (the best is kept)")
    ap.add_argument("--vocab", type=int, default=32000, help="prompt ids are drawn below this")
    ap.add_argument("--output-json", help="default: bench/results/spec-<device>-<date>.json")
    a = ap.parse_args()

    rng = random.Random(0)
    prompt = [rng.randrange(100, a.vocab) for _ in range(a.prompt_len)]
    motif = [rng.randrange(100, a.vocab) for _ in range(6)]
    loop_prompt = (motif * (a.prompt_len // len(motif) + 1))[:a.prompt_len]

    def best(prompt_ids, spec=None):
        rows = [run(a, prompt_ids, spec) for _ in range(a.reps)]
        return max(rows, key=lambda r: r["decode_tok_s"])

    results = []
    plain = best(prompt)
    results.append(dict(variant="plain", **{k: v for k, v in plain.items() if k != "ids"}))
    with tempfile.TemporaryDirectory() as td:
        oracle = Path(td) / "oracle.jsonl"
        oracle.write_text(json.dumps({"prompt_ids": prompt, "token_ids": plain["ids"]}) + "\n")
        for k in [int(x) for x in a.k.split(",") if x]:
            r = best(prompt, {"method": "oracle", "num_speculative_tokens": k, "oracle_file": str(oracle)})
            results.append(dict(variant=f"oracle k={k}", same_ids=r["ids"] == plain["ids"],
                                **parting(a, prompt, plain["ids"], r["ids"]),
                                speedup=r["decode_tok_s"] / plain["decode_tok_s"],
                                **{k2: v for k2, v in r.items() if k2 != "ids"}))
    head_dir = None
    if a.method == "eagle3":
        if not a.head:
            ap.error("--method eagle3 needs --head")
        head_dir = a.head
        if Path(a.head).is_file():  # a config alone: a folder holding it (dummy weights only)
            head_dir = tempfile.mkdtemp(prefix="eagle3-head-")
            atexit.register(shutil.rmtree, head_dir, True)
            shutil.copy(a.head, Path(head_dir) / "config.json")
    for k in [int(x) for x in a.k.split(",") if x] if a.method in ("mtp", "eagle3") else []:
        for forced in (False, True):
            spec = {"method": a.method, "num_speculative_tokens": k, "force_accept": forced}
            if head_dir:
                spec["model"] = str(head_dir)
            r = best(prompt, spec)
            results.append(dict(variant=f"{a.method} k={k}" + (" forced" if forced else ""),
                                same_ids=None if forced else r["ids"] == plain["ids"],
                                **({} if forced else parting(a, prompt, plain["ids"], r["ids"])),
                                speedup=r["decode_tok_s"] / plain["decode_tok_s"],
                                **{k2: v for k2, v in r.items() if k2 != "ids"}))
    loop_plain = best(loop_prompt)
    results.append(dict(variant="plain (loop prompt)", **{k: v for k, v in loop_plain.items() if k != "ids"}))
    r = best(loop_prompt, {"method": "ngram", "num_speculative_tokens": a.ngram_k, "prompt_lookup_min": 2})
    results.append(dict(variant=f"ngram k={a.ngram_k} (loop prompt)", same_ids=r["ids"] == loop_plain["ids"],
                        **parting(a, loop_prompt, loop_plain["ids"], r["ids"]),
                        speedup=r["decode_tok_s"] / loop_plain["decode_tok_s"],
                        **{k: v for k, v in r.items() if k != "ids"}))

    meta = dict(date=time.strftime("%Y-%m-%d %H:%M:%S"), device=a.device, config=a.config, model=a.model,
                prompt_len=a.prompt_len, tokens=a.tokens,
                commit=subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                      capture_output=True, text=True).stdout.strip())
    for row in results:
        row.update(meta)
        print(json.dumps(row))
    print(f"\n{'variant':30s} {'tok/s':>9s} {'speedup':>8s} {'tok/step':>9s} {'accepted':>12s} same ids")
    for row in results:
        acc = f"{row['accepted']}/{row['drafted']}" if "drafted" in row else ""
        print(f"{row['variant']:30s} {row['decode_tok_s']:9.1f} {row.get('speedup', 1.0):8.2f} "
              f"{row.get('acceptance_length', 1.0):9.2f} {acc:>12s} {row.get('same_ids', '')}")
    out = Path(a.output_json) if a.output_json else REPO / "bench" / "results" / \
        f"spec-{a.device.replace(':', '')}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"saved {out}")
    for row in results:
        if row.get("parts_at") is not None:
            print(f"{row['variant']}: parts from the plain run at output {row['parts_at']}; plain run's top-2 "
                  f"logits there: {row['gap_there']}")
    bad = [r["variant"] for r in results if r.get("same_ids") is False]
    if bad and a.device == "cpu":
        raise SystemExit(f"greedy ids differ from the plain run: {bad}")


if __name__ == "__main__":
    main()
