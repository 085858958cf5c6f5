#!/usr/bin/env python3
"""Greedy ids of kaon and of a running llama-server on the same GGUF file, side by side, with
the top-2 logit margin of both engines at each step, so that a divergence can be judged: a
near-tie (both margins tiny) or a bug.

For each prompt: both tokenizers' ids (they must agree; kaon's ids are fed to both engines),
`kaon run --temp 0 --print-ids` for the ids, `kaon logits` over prompt + kaon's ids for kaon's
margins (the logits of every position, so step i's margin is read at the position before its
token), and llama-server's /completion with the same ids, temperature 0 and n_probs 2 (the
top-2 log-probabilities of each step; their difference is the logit margin, the softmax's
normaliser cancelling). llama-server is yours to build and start (e.g.
`llama-server -m FILE -t 2 --port 8090`); nothing here builds it. (The llama-server path
follows its documented /tokenize and /completion fields but has not been run yet: the first
comparison, docs/PERF.md, used --llama-jsonl.) Or --llama-jsonl FILE: one
JSON line per prompt (in PROMPTS' order) from a libllama program of your own, with "ids" (its
tokenizer's ids of the prompt, BOS added), "gen" (greedy ids after kaon's prompt ids, which
must equal "ids"), "margin" (top-1 minus top-2 logit per step) and "top2" ([id, id] per step).

Prints a table per prompt and saves JSON under bench/results/."""
import argparse
import datetime
import json
import os
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [
    "The capital of France is",
    "Here is a Python function that returns the n-th Fibonacci number:\n\ndef fib(n):",
    "Once upon a time, in a small village by the sea, there lived",
    "Question: What is 17 times 23?\nAnswer:",
]


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def kaon(exe, *args):
    r = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, check=True)
    return r.stdout


def kaon_greedy(exe, model, ids, n, threads):
    out = kaon(exe, "run", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", n, "--temp", 0,
               "--ignore-eos", "--print-ids", "--threads", threads)
    return json.loads(out.strip().splitlines()[-1])


def kaon_margins(exe, model, ids, gen, threads):
    """Top-2 margin and top-2 ids at each generated step, from the logits of prompt + gen."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "logits.f32"
        seq = ids + gen[:-1]
        kaon(exe, "logits", "-m", model, "--prompt-ids", ",".join(map(str, seq)), "-o", out, "--threads", threads)
        lg = np.fromfile(out, np.float32).reshape(len(seq), -1)[len(ids) - 1:]
    top = np.argsort(lg, -1)[:, -2:][:, ::-1]
    return [(float(l[t[0]] - l[t[1]]), int(t[0]), int(t[1])) for l, t in zip(lg, top)]


def llama_greedy(url, ids, n):
    """llama-server's greedy ids and (margin, top id, second id) per step."""
    r = post(url + "/completion", {"prompt": ids, "n_predict": n, "temperature": 0, "top_k": 1,
                                   "n_probs": 2, "cache_prompt": False, "return_tokens": True,
                                   "ignore_eos": True})
    steps = r["completion_probabilities"]
    got = [s["id"] for s in steps]
    margins = []
    for s in steps:
        tp = s["top_logprobs"]
        margins.append((float(tp[0]["logprob"] - tp[1]["logprob"]), tp[0]["id"], tp[1]["id"]))
    return got, margins


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--kaon", default=Path(os.environ.get("KAON_BUILD", REPO / "build")) / "kaon")
    ap.add_argument("--llama-url", default="http://127.0.0.1:8090")
    ap.add_argument("--llama-jsonl", default=None, help="llama.cpp's results as JSON lines (see above)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--result-dir", default=REPO / "bench" / "results")
    a = ap.parse_args()
    results = []
    lines = [json.loads(x) for x in Path(a.llama_jsonl).read_text().splitlines()] if a.llama_jsonl else None
    for k, p in enumerate(PROMPTS):
        ids = json.loads(kaon(a.kaon, "tokenize", "-m", a.model, "--text", p))
        kg = kaon_greedy(a.kaon, a.model, ids, a.n, a.threads)
        km = kaon_margins(a.kaon, a.model, ids, kg, a.threads)
        if lines:
            lids, lg = lines[k]["ids"], lines[k]["gen"][:a.n]
            lm = [(m, t[0], t[1]) for m, t in zip(lines[k]["margin"], lines[k]["top2"])]
        else:
            lids = post(a.llama_url + "/tokenize", {"content": p, "add_special": True})["tokens"]
            lg, lm = llama_greedy(a.llama_url, ids, a.n)
        first = next((i for i in range(a.n) if kg[i] != lg[i]), None)
        print(f"\nprompt {p!r}: {len(ids)} ids, tokenizers {'agree' if ids == lids else f'DIFFER: llama {lids}'}")
        print(f"  kaon  {kg}\n  llama {lg}")
        if first is None:
            print(f"  same {a.n} ids; smallest margin kaon {min(m[0] for m in km):.4f}, "
                  f"llama {min(m[0] for m in lm):.4f}")
        else:
            print(f"  first divergence at step {first}: kaon {kg[first]} (margin {km[first][0]:.4f}, top2 "
                  f"{km[first][1:]}), llama {lg[first]} (margin {lm[first][0]:.4f}, top2 {lm[first][1:]})")
        results.append({"prompt": p, "ids": ids, "llama_tokenize": lids, "kaon": kg, "llama": lg,
                        "kaon_margins": km, "llama_margins": lm, "first_divergence": first})
    out = Path(a.result_dir) / f"greedy_vs_llama-{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%SZ}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": str(a.model), "threads": a.threads, "results": results}, indent=1))
    print(f"\nsaved {out}")


if __name__ == "__main__":
    main()
