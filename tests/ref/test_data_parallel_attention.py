"""DP attention on the CPU (--data-parallel-size D --enable-expert-parallel: D worker threads,
src/model/tp.c's kaon_dp_create): each rank runs embedding, attention, dense layers and the LM
head for its own sequences only, with its 1/D part of the KV pool (kv_cache.c's parts), and the
MoE layers exchange tokens so that each rank's experts see every rank's tokens (kaon_dp_moe:
all_to_allv both ways, the returned parts summed in rank order). A dense model is plainly data
parallel. Against one rank on tiny Llama, Qwen3-MoE and DeepSeek (V3 and V2-Lite-like)
checkpoints: logits within the f32 reduction-order bound of test_tensor_parallel.py (only the
order of the experts' sums changes: each rank sums its experts, then the ranks' parts are
added), the same greedy ids for prompts batched together (chunked prefill, a shared prefix so
prefix hits happen within a rank's part, preemption when a part runs dry), the KV bytes split
over the ranks, and one-line refusals of what is not supported.
"""
import re

import pytest

from test_tensor_parallel import check_close, generate, kaon_logits, prompts, run
from test_tensor_parallel_moe import build

IDS = [1, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13, 8, 150, 77, 31]
KV = ["--kv-cache-memory", "8"]  # MiB: small pools (reserving 1 GiB per run is slow)


def dp_flags(d):
    return [] if d == 1 else ["--data-parallel-size", str(d), "--enable-expert-parallel"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("dp")
    from tiny_models import make_config, make_weights, save_hf
    cfg = make_config("llama")
    out = {"llama": save_hf(d / "llama", cfg, make_weights(cfg, seed=11), "F32")}
    for name in ["qwen3moe", "ds-v3", "ds-v2-lite"]:
        out[name] = build(d, name)
    return out


NAMES = ["llama", "qwen3moe", "ds-v3", "ds-v2-lite"]


def logits(exe, model, tmp_path, d, mode):
    return kaon_logits(exe, model, tmp_path, dp_flags(d), d, IDS, mode, threads=2)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["prefill", "decode", "chunk7"])
def test_logits_match_one_rank(kaon_bin, models, tmp_path, name, mode):
    # One sequence: rank 0 computes it, rank 1 joins every MoE exchange with no tokens.
    ref = logits(kaon_bin, models[name], tmp_path, 1, mode)
    check_close(logits(kaon_bin, models[name], tmp_path, 2, mode), ref, f"{name} DP 2 {mode}")


@pytest.mark.parametrize("name,d", [("llama", 2), ("qwen3moe", 2), ("ds-v3", 2), ("ds-v2-lite", 2), ("qwen3moe", 4)])
def test_batched_chunked_prefix_greedy_ids(kaon_bin, models, tmp_path, name, d):
    # Prompts of 3..41 tokens after a shared 20-token prefix, chunked 24 tokens a step: every
    # rank runs mixed prefill and decode sub-batches, and later prompts hit their rank's cache.
    ps = prompts(10, seed=d, prefix=20)
    extra = ["--max-num-seqs", "6", "--max-num-batched-tokens", "24", "--block-size", "4", *KV]
    one, _ = generate(kaon_bin, models[name], tmp_path, ps, 1, extra, name="one")
    many, st = generate(kaon_bin, models[name], tmp_path, ps, 1, extra + dp_flags(d), name=f"dp{d}")
    assert many == one
    assert st["steps"] < 10 * 12, st  # really batched
    assert st["prefix_hit_tokens"] >= 4 * 16, st


def test_preemption_within_a_rank(kaon_bin, models, tmp_path, monkeypatch):
    # A pool so small that each rank's part holds about two sequences: the newest sequence of
    # the rank that ran dry is preempted, recomputed later, and the ids do not change (admitting
    # by the prompt alone, KAON_ADMIT_RATIO=0, so that the part runs dry).
    monkeypatch.setenv("KAON_ADMIT_RATIO", "0")
    ps = prompts(8, seed=7)
    extra = ["--max-num-seqs", "8", "--max-num-batched-tokens", "32", "--block-size", "4", "--no-prefix-caching",
             "--kv-cache-memory", "0.23", "--max-model-len", "60"]  # 52 blocks of 4 tokens
    one, _ = generate(kaon_bin, models["ds-v3"], tmp_path, ps, 1, extra, name="one")
    many, st = generate(kaon_bin, models["ds-v3"], tmp_path, ps, 1, extra + dp_flags(2), name="dp2")
    assert st["preemptions"] > 0, st
    assert many == one


def rank_kv_bytes(exe, model, tmp_path, d):
    inp, out = tmp_path / "kv.in.jsonl", tmp_path / "kv.out.jsonl"
    inp.write_text('{"prompt_ids": [1, 2, 3]}\n')
    r = run([exe, "generate", "-m", model, "--input", inp, "--output", out, "--threads", "2", "--max-tokens", "1",
             *KV, *dp_flags(d)])
    total = int(re.search(r"(\d+) KV blocks x", r.stderr).group(1))
    per_rank = [int(x) for x in re.findall(r"data parallel: rank \d+ of \d+: .*KV cache [\d.]+ MiB \((\d+) bytes\)",
                                          r.stderr)]
    return total, per_rank


@pytest.mark.parametrize("name", ["ds-v3", "qwen3moe"])
def test_kv_cache_split_over_ranks(kaon_bin, models, tmp_path, name):
    # The same pool as one rank's, in D parts: MLA's latent (or GQA's K/V) bytes per rank are
    # 1/D of one rank's, not replicated as under tensor parallelism.
    blocks1, none = rank_kv_bytes(kaon_bin, models[name], tmp_path, 1)
    blocks2, parts = rank_kv_bytes(kaon_bin, models[name], tmp_path, 2)
    assert none == [] and blocks1 == blocks2 and len(parts) == 2
    per_block = parts[0] // (blocks2 // 2)
    assert parts[0] + parts[1] == blocks1 * per_block, (parts, blocks1)


def refused(exe, model, tmp_path, flags, words):
    r = run([exe, "logits", "-m", model, "--prompt-ids", "1,2,3", "-o", tmp_path / "x.f32", *flags], ok=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and words in lines[0], r.stderr


def test_refusals(kaon_bin, models, tmp_path):
    refused(kaon_bin, models["qwen3moe"], tmp_path, ["--data-parallel-size", "2"],
            "--data-parallel-size 2 needs --enable-expert-parallel")
    refused(kaon_bin, models["llama"], tmp_path, ["--data-parallel-size", "2"], "needs --enable-expert-parallel")
    refused(kaon_bin, models["qwen3moe"], tmp_path, ["-tp", "2", *dp_flags(2)], "with --tensor-parallel-size 2")
    mix = build(tmp_path, "mixtral", num_local_experts=3)  # 3 experts over 4 ranks
    refused(kaon_bin, mix, tmp_path, dp_flags(4), "data parallel: expert parallel with 3 experts over 4 ranks")
    q2 = build(tmp_path, "qwen2moe", shared_expert_intermediate_size=66)  # 66 over 4
    refused(kaon_bin, q2, tmp_path, dp_flags(4), "data parallel: shared_expert_intermediate_size 66")


def test_uneven_expert_ranges(kaon_bin, tmp_path):
    # 6 experts over 4 ranks: [0, 1), [1, 3), [3, 4), [4, 6); and a batch with fewer sequences
    # than ranks at times (idle ranks still serve their experts).
    model = build(tmp_path, "mixtral", num_local_experts=6)
    ref = logits(kaon_bin, model, tmp_path, 1, "chunk7")
    check_close(logits(kaon_bin, model, tmp_path, 4, "chunk7"), ref, "6 experts over DP 4")
    ps = prompts(5, seed=4)
    extra = ["--max-num-seqs", "3", "--max-num-batched-tokens", "16", *KV]
    one, _ = generate(kaon_bin, model, tmp_path, ps, 1, extra, name="one")
    many, _ = generate(kaon_bin, model, tmp_path, ps, 1, extra + dp_flags(4), name="dp4")
    assert many == one
