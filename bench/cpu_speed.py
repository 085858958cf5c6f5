#!/usr/bin/env python3
"""CPU speed of `kaon run` on a model: prompt processing (pp, a random prompt of --pp tokens)
and generation (tg, --tg tokens after a 1-token prompt), median of --reps runs, the same
measurements llama.cpp's llama-bench makes (pp512, tg128). With --llama-bench PATH (a
llama-bench binary you built yourself) both engines run on the same file and thread count and a
side-by-side table is printed. Results are saved as JSON under bench/results/."""
import argparse
import datetime
import json
import os
import platform
import random
import re
import statistics
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def kaon_once(exe, model, ids, n, threads):
    cmd = [str(exe), "run", "-m", str(model), "--prompt-ids", ",".join(map(str, ids)), "-n", str(n),
           "--temp", "0", "--ignore-eos", "--print-ids", "--threads", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = re.search(r"prompt (\d+) tokens in [\d.]+ s \(([\d.]+) tok/s\); generated (\d+) tokens, ([\d.]+) tok/s", r.stderr)
    if not m:
        raise RuntimeError(r.stderr)
    return float(m.group(2)), float(m.group(4))


def kaon_bench(exe, model, pp, tg, threads, reps, vocab):
    rng = random.Random(0)
    pps, tgs = [], []
    for _ in range(reps):
        ids = [rng.randrange(2, vocab) for _ in range(pp)]
        pps.append(kaon_once(exe, model, ids, 1, threads)[0])
        tgs.append(kaon_once(exe, model, [1], tg + 1, threads)[1])
    return statistics.median(pps), statistics.median(tgs), pps, tgs


def llama_bench(path, model, pp, tg, threads, reps):
    cmd = [path, "-m", str(model), "-t", str(threads), "-p", str(pp), "-n", str(tg), "-r", str(reps), "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rows = json.loads(r.stdout)
    out = {}
    for row in rows:
        key = "pp" if row["n_prompt"] > 0 else "tg"
        out[key] = row["avg_ts"]
        out["commit"] = row.get("build_commit")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--kaon", default=Path(os.environ.get("KAON_BUILD", REPO / "build")) / "kaon")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"))
    a = ap.parse_args()
    k_pp, k_tg, pps, tgs = kaon_bench(a.kaon, a.model, a.pp, a.tg, a.threads, a.reps, a.vocab)
    res = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
           "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "machine": f"{platform.node()} {platform.processor() or platform.machine()} nproc={os.cpu_count()}",
           "model": Path(a.model).name, "threads": a.threads,
           "kaon": {f"pp{a.pp}": k_pp, f"tg{a.tg}": k_tg, "pp_runs": pps, "tg_runs": tgs}}
    print(f"{'engine':<12} {'pp' + str(a.pp):>12} {'tg' + str(a.tg):>12}   (tok/s, {a.threads} threads, median of {a.reps})")
    print(f"{'kaon':<12} {k_pp:12.1f} {k_tg:12.1f}")
    if a.llama_bench:
        lb = llama_bench(a.llama_bench, a.model, a.pp, a.tg, a.threads, a.reps)
        res["llama.cpp"] = lb
        print(f"{'llama.cpp':<12} {lb['pp']:12.1f} {lb['tg']:12.1f}   (llama-bench, build {lb.get('commit')})")
        print(f"{'kaon / l.cpp':<12} {k_pp / lb['pp']:12.2f}x {k_tg / lb['tg']:11.2f}x")
    out = REPO / "bench" / "results" / f"cpu_speed-{res['date'].replace(':', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"saved {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
