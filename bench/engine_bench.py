#!/usr/bin/env python3
"""Engine benchmarks (offline, no HTTP):
  throughput  `kaon generate` of N prompts x T new tokens, all at once vs one at a time
              (--max-num-seqs 1), same engine, same model, same threads; prints tok/s and the
              ratio. Each mode runs --reps times, alternating, and its fastest run counts (on a
              shared machine other jobs only ever slow a run down); every run is recorded.
  overhead    the engine's own cost per sequence per step with the no-op backend (--device
              noop: no model math) at S running sequences, on a tiny random model (vocab 300,
              so the host sampling math is negligible) and on the default model (vocab 49152,
              whose full-vocabulary sampling is included).
Results are printed and saved under bench/results/."""
import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "ref"))


def run_generate(exe, model, prompts, extra):
    with tempfile.TemporaryDirectory() as d:
        inp, out = Path(d) / "in.jsonl", Path(d) / "out.jsonl"
        inp.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
        r = subprocess.run([str(exe), "generate", "-m", str(model), "--input", str(inp), "--output", str(out),
                            "--quiet", *extra], capture_output=True, text=True, check=True)
        stats = json.loads(r.stderr.split("kaon-stats: ", 1)[1].splitlines()[0])
        rows = [json.loads(l) for l in out.read_text().splitlines()]
    return stats, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kaon", default=Path(os.environ.get("KAON_BUILD", REPO / "build")) / "kaon")
    ap.add_argument("--model", default=REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    rng = random.Random(0)
    res = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
           "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "machine": f"{platform.node()} nproc={os.cpu_count()}", "threads": a.threads}

    prompts = [[1] + [rng.randrange(2, 49152) for _ in range(rng.randrange(16, 64))] for _ in range(a.prompts)]
    common = ["--temp", "0", "--ignore-eos", "--max-tokens", str(a.tokens), "--threads", a.threads]
    secs_b, secs_1 = [], []
    for _ in range(max(1, a.reps)):
        st_b, rows_b = run_generate(a.kaon, a.model, prompts, common + ["--max-num-seqs", str(a.prompts)])
        st_1, rows_1 = run_generate(a.kaon, a.model, prompts, common + ["--max-num-seqs", "1"])
        secs_b.append(st_b["seconds"])
        secs_1.append(st_1["seconds"])
    gen = sum(len(r["token_ids"]) for r in rows_b)
    tb, t1 = gen / min(secs_b), gen / min(secs_1)
    same = sum(r1["token_ids"] == rb["token_ids"] for r1, rb in zip(rows_1, rows_b))
    res["throughput"] = {"prompts": a.prompts, "new_tokens": a.tokens, "batched_tok_s": tb, "one_by_one_tok_s": t1,
                         "ratio": tb / t1, "identical_outputs": same, "batched_s": min(secs_b), "one_by_one_s": min(secs_1),
                         "batched_runs_s": secs_b, "one_by_one_runs_s": secs_1}
    print(f"throughput: {a.prompts} prompts x {a.tokens} tokens, best of {len(secs_b)}: batched {tb:.1f} tok/s "
          f"({min(secs_b):.1f} s), one by one {t1:.1f} tok/s ({min(secs_1):.1f} s): {tb / t1:.2f}x; "
          f"identical greedy outputs {same}/{a.prompts}; runs: batched {', '.join(f'{x:.1f}' for x in secs_b)} s, "
          f"one by one {', '.join(f'{x:.1f}' for x in secs_1)} s")

    from tiny_models import make_config, make_weights, save_hf
    with tempfile.TemporaryDirectory() as d:
        cfg = make_config("llama")
        cfg["max_position_embeddings"] = 4096
        tiny = save_hf(Path(d) / "tiny", cfg, make_weights(cfg), "F32")
        for label, model, vocab in (("tiny (vocab 300)", tiny, 300), ("default model (vocab 49152)", a.model, 49152)):
            ps = [[rng.randrange(3, vocab) for _ in range(16)] for _ in range(a.seqs)]
            runs = []
            for _ in range(max(1, a.reps) * 2):  # short runs: a few more of them
                st, rows = run_generate(a.kaon, model, ps, ["--device", "noop", "--temp", "0", "--ignore-eos", "--max-tokens", "64",
                                                           "--max-num-seqs", str(a.seqs), "--max-num-batched-tokens", "4096"])
                seq_steps = sum(len(r["token_ids"]) for r in rows)  # one sampled token per running seq per step
                runs.append(st["seconds"] / seq_steps * 1e6)
            us = min(runs)
            res.setdefault("overhead", {})[label] = {"seqs": a.seqs, "steps": st["steps"], "us_per_seq_step": us,
                                                     "runs_us": runs}
            print(f"overhead, noop backend, {a.seqs} running, {label}: {st['steps']} steps, {us:.2f} us per sequence "
                  f"per step (best of {len(runs)}: {', '.join(f'{x:.2f}' for x in runs)})")
    out = REPO / "bench" / "results" / f"engine-{res['date'].replace(':', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"saved {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
