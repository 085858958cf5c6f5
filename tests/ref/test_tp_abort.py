"""A rank that fails before a collective must not leave the others waiting in it (issue 18's
abort path, src/model/tp.c + the communicators' abort/recover). KAON_TP_FAIL=R:S (a test aid)
makes rank R fail its step S before any collective; the other ranks are then inside their first
all-reduce or exchange. The step must end with an error naming the rank and the cause (not a
hang: every run here has a timeout), its sequences fail, and the engine goes on: later steps run
on all ranks again and give the same tokens as one rank.
"""
import json
import os
import subprocess

import pytest

from test_tensor_parallel import prompts, tiny_cfg
from test_tensor_parallel_moe import build
from tiny_models import make_weights, save_hf

TIMEOUT = 120  # s: a hang fails the test instead of the suite


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("abort")
    cfg = tiny_cfg("llama")
    return {"llama": save_hf(d / "llama", cfg, make_weights(cfg, seed=11), "F32"), "qwen3moe": build(d, "qwen3moe")}


def kaon(cmd, fail=None):
    env = dict(os.environ)
    env.pop("KAON_TP_FAIL", None)
    if fail:
        env["KAON_TP_FAIL"] = fail
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=TIMEOUT, env=env)


@pytest.mark.parametrize("flags,rank", [(["-tp", "2"], 1), (["-tp", "4"], 3), (["-tp", "4"], 0),
                                        (["--data-parallel-size", "2", "--enable-expert-parallel"], 1)])
def test_failed_rank_ends_the_step(kaon_bin, models, tmp_path, flags, rank):
    model = models["qwen3moe" if "--enable-expert-parallel" in flags else "llama"]
    r = kaon([kaon_bin, "logits", "-m", model, "--prompt-ids", "1,17,250,3,99,42", "-o", tmp_path / "x.f32",
              "--threads", "2", *flags], fail=f"{rank}:0")
    assert r.returncode != 0
    assert f"rank {rank}: injected failure" in r.stderr, r.stderr[-2000:]


def generate(exe, model, tmp_path, ps, flags, fail=None, name="g"):
    inp, out = tmp_path / f"{name}.in.jsonl", tmp_path / f"{name}.out.jsonl"
    inp.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in ps))
    kaon([exe, "generate", "-m", model, "--input", inp, "--output", out, "--threads", "2", "--quiet", "--temp",
          "0", "--max-tokens", "8", "--ignore-eos", "--max-num-seqs", "2", "--no-prefix-caching", *flags], fail=fail)
    return [json.loads(l) for l in out.read_text().splitlines()]


@pytest.mark.parametrize("name,flags", [("llama", ["-tp", "2"]),
                                        ("qwen3moe", ["--data-parallel-size", "2", "--enable-expert-parallel"])])
def test_engine_goes_on_after_a_failed_step(kaon_bin, models, tmp_path, name, flags):
    ps = prompts(8, seed=5)
    one = generate(kaon_bin, models[name], tmp_path, ps, [], name="one")
    rows = generate(kaon_bin, models[name], tmp_path, ps, flags, fail="1:3", name="fail")
    failed = [r for r in rows if r.get("error")]
    assert 1 <= len(failed) <= 2, rows  # the sequences of step 3 (at most 2 run at once)
    for r in failed:
        assert r["finish_reason"] == "error" and "injected failure" in r["error"], r
    # Every other request ran to the end on all ranks, with the tokens of one rank.
    for r, ref in zip(rows, one):
        if not r.get("error"):
            assert r["token_ids"] == ref["token_ids"], (r, ref)
    assert len(rows) - len(failed) >= 6
