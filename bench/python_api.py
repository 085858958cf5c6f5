#!/usr/bin/env python3
"""The Python API's overhead: 64 prompts x 64 greedy tokens through LLM.generate against the
same batch through `kaon generate` (same engine defaults, prefix caching off so repeated runs
compute the same work). A model named dummy:CONFIG (random weights of a real config, no tokenizer:
the GPU machine, where weights cannot travel) gets prompts of random token ids instead of text. Both times exclude loading the model: kaon generate reports its own
generation time, LLM.generate is timed around the call. Medians of --runs runs, interleaved.

    KAON_BUILD=build python bench/python_api.py [--runs 5]   (kaon importable, or KAON_LIBRARY set)
    python bench/python_api.py --device cuda --model dummy:bench/configs/llama-3.1-8b.json
"""
import argparse
import datetime
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def prompts(n):
    topics = ["the ocean", "a city at night", "prime numbers", "an old library", "the moon", "a robot",
              "winter mornings", "a river", "coffee", "mountains", "a lost key", "the printing press"]
    return [f"Story {i}: write a few sentences about {topics[i % len(topics)]} and the number {i * 37}."
            for i in range(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.4,
                    help="LLM's engine on a GPU: it stays up while kaon generate (default 0.9 of the "
                         "whole GPU, what LLM holds included) runs beside it")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    build = os.environ.get("KAON_BUILD", os.path.join(ROOT, "build"))
    try:
        import kaon
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        os.environ.setdefault("KAON_LIBRARY", os.path.join(build, "libkaon.so.0"))
        import kaon
    from kaon import LLM, SamplingParams

    tmp = tempfile.mkdtemp()
    inp, outp = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
    if a.model.startswith("dummy:"):
        rng = random.Random(7)
        ids = [[rng.randrange(1000, 30000) for _ in range(24 + i % 16)] for i in range(a.prompts)]
        ps = [{"prompt_token_ids": p} for p in ids]
        lines = [{"prompt_ids": p} for p in ids]
        model_args = ["-m", a.model[len("dummy:"):], "--load-format", "dummy"]
    else:
        ps = prompts(a.prompts)
        lines = [{"prompt": p} for p in ps]
        model_args = ["-m", a.model]
    with open(inp, "w") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    cli = [os.path.join(build, "kaon"), "generate", *model_args, "--device", a.device, "--input", inp, "--output",
           outp, "--temp", "0", "--max-tokens", str(a.tokens), "--ignore-eos", "--no-prefix-caching", "--quiet"]
    gpu = {}
    if a.device != "cpu":
        gpu = {"gpu_memory_utilization": a.gpu_memory_utilization}
    llm = LLM(a.model, enable_prefix_caching=False, device=a.device, **gpu)
    sp = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    llm.generate(ps[:2], SamplingParams(temperature=0, max_tokens=4))  # warm up
    t_cli, t_py, same = [], [], True
    for r in range(a.runs):
        run = subprocess.run(cli, capture_output=True, text=True)
        if run.returncode:
            sys.exit(f"kaon generate failed ({run.returncode}): {run.stderr[-2000:]}")
        err = run.stderr
        t_cli.append(float(re.search(r"generated tokens in ([0-9.]+) s", err).group(1)))
        t0 = time.perf_counter()
        outs = llm.generate(ps, sp)
        t_py.append(time.perf_counter() - t0)
        with open(outp) as f:
            want = [json.loads(line)["token_ids"] for line in f]
        same &= [o.outputs[0].token_ids for o in outs] == want
        print(f"run {r + 1}: kaon generate {t_cli[-1]:.2f} s, LLM.generate {t_py[-1]:.2f} s", flush=True)
    tok = a.prompts * a.tokens
    m_cli, m_py = statistics.median(t_cli), statistics.median(t_py)
    # Each run's pair ran back to back: their ratio holds up better than the medians when other
    # work on the machine comes and goes.
    ratio = statistics.median(p / c for p, c in zip(t_py, t_cli))
    res = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
           "machine": f"{os.cpu_count()} cores", "device": a.device, "model": os.path.basename(a.model), "prompts": a.prompts,
           "tokens": a.tokens, "runs": a.runs, "kaon_generate_s": t_cli, "llm_generate_s": t_py,
           "median_kaon_generate_s": m_cli, "median_llm_generate_s": m_py,
           "kaon_generate_tok_s": tok / m_cli, "llm_generate_tok_s": tok / m_py,
           "python_over_cli": m_py / m_cli - 1, "median_paired_ratio": ratio, "same_token_ids": same, "kaon_library": kaon.library_version}
    print(f"median: kaon generate {m_cli:.2f} s ({tok / m_cli:.1f} tok/s), LLM.generate {m_py:.2f} s "
          f"({tok / m_py:.1f} tok/s): Python {100 * (m_py / m_cli - 1):+.1f}%; median of the paired ratios "
          f"{100 * (ratio - 1):+.1f}%; same ids: {same}")
    out = a.out or os.path.join(ROOT, "bench", "results", f"python_api-{res['date'].replace(':', '')}.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"saved {out}")
    llm.close()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
