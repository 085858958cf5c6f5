"""Where greedy speculative decoding departs from plain decoding on the GPU (tiny checkpoints of
tests/ref): for each differing request, both outputs, finish reasons and errors, and the
position where they part. Usage: python3 tests/gpu/spec_check.py [llama|v3] [extra kaon args]"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "ref"))
import deepseek_models  # noqa: E402
from test_spec_decode import loop_prompts  # noqa: E402
from tiny_models import make_config, make_weights, save_hf  # noqa: E402


def run(exe, model, prompts, extra, td, name):
    inp, out = Path(td) / f"{name}.in", Path(td) / f"{name}.out"
    inp.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
    r = subprocess.run([exe, "generate", "-m", str(model), "--input", str(inp), "--output", str(out), "--quiet",
                        "--device", "cuda", "--temp", "0", "--max-tokens", "24", "--ignore-eos", *extra],
                       capture_output=True, text=True, timeout=600)
    print(name, "rc", r.returncode, r.stderr[-1500:])
    return [json.loads(l) for l in out.read_text().splitlines()] if out.exists() else []


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else "v3"
    extra = sys.argv[2:]
    exe = str(Path(__import__("os").environ.get("KAON_BUILD", REPO / "build-gpu")) / "kaon")
    with tempfile.TemporaryDirectory() as td:
        if which == "llama":
            cfg = make_config("llama")
            model = save_hf(Path(td) / "llama", cfg, make_weights(cfg, seed=7), "F32")
        else:
            cfg = deepseek_models.make_config("v3")
            model = deepseek_models.save_hf(Path(td) / "v3", cfg, deepseek_models.make_weights(cfg, seed=7), "F32")
        prompts = loop_prompts()
        plain = run(exe, model, prompts, ["--max-num-seqs", "1"] + extra, td, "plain")
        spec = run(exe, model, prompts, ["--max-num-seqs", "1", "--speculative-config",
                                          json.dumps({"method": "ngram", "num_speculative_tokens": 4,
                                                      "prompt_lookup_min": 1, "disable_by_batch_size": -1})] + extra,
                   td, "spec")
        bad = 0
        for i, (a, b) in enumerate(zip(plain, spec)):
            if a["token_ids"] == b["token_ids"]:
                continue
            bad += 1
            at = next((j for j, (x, y) in enumerate(zip(a["token_ids"], b["token_ids"])) if x != y),
                      min(len(a["token_ids"]), len(b["token_ids"])))
            print(f"request {i} (prompt {len(prompts[i])} tokens) parts at output {at}: plain {a['finish_reason']} "
                  f"{a.get('error')} {a['token_ids']}\n   spec {b['finish_reason']} {b.get('error')} {b['token_ids']}")
        print(f"{bad} of {len(plain)} requests differ")


if __name__ == "__main__":
    main()
