"""Tensor and expert parallelism of mixture-of-experts models on the CPU (src/model/tp_moe.c):
-tp N splits every expert's FFN columns (and the shared expert's) over the N ranks; with
--enable-expert-parallel each expert lives whole on one rank (contiguous ranges, uneven when N
does not divide the experts). Attention is split as for dense models either way, the router is
replicated, and one all-reduce after each MoE block sums the ranks' parts.

Tiny Qwen3-MoE (a dense first layer, 16 experts top-4), Mixtral (8 experts top-2) and Qwen2-MoE
(a gated shared expert) checkpoints (moe_models.py) in the per-expert HF layout, transformers
5's fused layout and GGUF's stacked one, and DeepSeek ones (deepseek_models.py: MLA split by
heads with the latent cache on every rank; V3's sigmoid group routing, V2-Lite's q_proj and two
shared experts; HF and GGUF), against one rank: logits within the f32
reduction-order bound of test_tensor_parallel.py (sharding and placement only change the order
of sums: each rank's partial outputs, then the ranks' sum; routing sees the same values on every
rank), greedy ids equal, batched and chunked. Uneven splits are refused with exit status 2 and
one line.
"""
import subprocess

import pytest

from moe_models import fuse_experts, make_moe_config, make_moe_weights, save_moe_gguf
from test_tensor_parallel import check_close, generate, kaon_logits, prompts, run
from tiny_models import save_hf

IDS = [1, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13, 8, 150, 77, 31]


def logits(exe, model, tmp_path, par, mode="prefill", ids=IDS):
    return kaon_logits(exe, model, tmp_path, par_flags(par), par, ids, mode)


def par_flags(par):
    """'tp2' -> -tp 2; 'ep4' -> -tp 4 --enable-expert-parallel; 'one' -> one rank."""
    if par == "one":
        return ["-tp", "1"]
    n = par[2:]
    return ["-tp", n] + (["--enable-expert-parallel"] if par.startswith("ep") else [])


def build(d, name, seed=5, **over):
    if name.startswith("ds-"):  # DeepSeek (deepseek_models.py): ds-CONFIG or ds-CONFIG-gguf
        import deepseek_models as dm
        conf = name[3:].removesuffix("-gguf")
        cfg = dm.make_config(conf)
        cfg.update(over)
        w = dm.make_weights(cfg, seed=seed)
        if name.endswith("-gguf"):
            return dm.save_gguf(d / f"{name}.gguf", cfg, w)
        return dm.save_hf(d / name, cfg, w, "F32")
    arch, _, layout = name.partition("-")
    cfg = make_moe_config(arch)
    cfg.update(over)
    w = make_moe_weights(cfg, seed=seed)
    if layout == "gguf":
        save_moe_gguf(d / f"{name}.gguf", cfg, w)  # returns the weights it wrote
        return d / f"{name}.gguf"
    return save_hf(d / name, cfg, fuse_experts(cfg, w) if layout == "fused" else w, "F32")


@pytest.fixture(scope="module", params=["qwen3moe", "mixtral", "qwen2moe", "qwen3moe-gguf", "mixtral-fused", "ds-v3",
                                        "ds-v2-lite", "ds-v3-gguf"])
def moe(tmp_path_factory, request):
    return build(tmp_path_factory.mktemp("tpmoe"), request.param)


@pytest.mark.parametrize("par", ["tp2", "tp4", "ep2", "ep4"])
@pytest.mark.parametrize("mode", ["prefill", "decode", "chunk7"])
def test_logits_match_one_rank(kaon_bin, moe, tmp_path, par, mode):
    ref = logits(kaon_bin, moe, tmp_path, "one", mode)
    check_close(logits(kaon_bin, moe, tmp_path, par, mode), ref, f"{moe.name} {par} {mode}")


@pytest.mark.parametrize("par", ["tp2", "ep4"])
def test_batched_chunked_greedy_ids(kaon_bin, moe, tmp_path, par):
    ps = prompts(12, seed=3)
    extra = ["--max-num-seqs", "6", "--max-num-batched-tokens", "24", "--no-prefix-caching"]
    one, _ = generate(kaon_bin, moe, tmp_path, ps, 1, extra, name="one")
    n = par[2:]
    many, st = generate(kaon_bin, moe, tmp_path, ps, n,
                        extra + (["--enable-expert-parallel"] if par.startswith("ep") else []), name=par)
    assert many == one
    assert st["steps"] < 12 * 12  # really batched


def test_uneven_expert_ranges(kaon_bin, tmp_path):
    # 6 experts over 4 ranks: [0, 1), [1, 3), [3, 4), [4, 6).
    model = build(tmp_path, "mixtral", num_local_experts=6)
    ref = logits(kaon_bin, model, tmp_path, "one")
    check_close(logits(kaon_bin, model, tmp_path, "ep4"), ref, "6 experts over EP 4")


def test_expert_parallel_keeps_experts_whole(kaon_bin, tmp_path):
    # An expert width that does not split over 4 ranks: refused under TP, fine under EP.
    model = build(tmp_path, "qwen3moe", moe_intermediate_size=30)
    refused(kaon_bin, model, tmp_path, "tp4", "moe_intermediate_size 30")
    check_close(logits(kaon_bin, model, tmp_path, "ep4"), logits(kaon_bin, model, tmp_path, "one"),
                "moe_intermediate_size 30 over EP 4")


def refused(exe, model, tmp_path, par, words):
    r = run([exe, "logits", "-m", model, "--prompt-ids", "1,2,3", "-o", tmp_path / "x.f32", *par_flags(par)],
            ok=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and words in lines[0] and "tensor parallel" in lines[0], r.stderr


@pytest.mark.parametrize("arch,over,par,words", [
    ("qwen2moe", {"shared_expert_intermediate_size": 66}, "tp4", "shared_expert_intermediate_size 66"),
    ("qwen2moe", {"shared_expert_intermediate_size": 66}, "ep4", "shared_expert_intermediate_size 66"),
    ("mixtral", {"num_local_experts": 3}, "ep4", "3 experts over 4 ranks"),
    ("mixtral", {"intermediate_size": 90}, "tp4", "moe_intermediate_size 90"),
])
def test_uneven_splits_refused(kaon_bin, tmp_path, arch, over, par, words):
    refused(kaon_bin, build(tmp_path, arch, **over), tmp_path, par, words)


@pytest.mark.parametrize("par", ["tp2", "ep4"])
def test_mla_expanded_prefill(kaon_bin, tmp_path, monkeypatch, par):
    # MLA's expanded prefill (each head's keys and values from the latents, blocks_mla.c) on
    # every chunk of 2 tokens or more, with each rank's heads.
    monkeypatch.setenv("KAON_MLA_EXPAND_MIN", "2")
    model = build(tmp_path, "ds-v3")
    ref = logits(kaon_bin, model, tmp_path, "one", "chunk7")
    check_close(logits(kaon_bin, model, tmp_path, par, "chunk7"), ref, f"MLA expanded {par}")


@pytest.mark.parametrize("name,par", [("qwen3moe", "tp2"), ("qwen3moe", "ep4"), ("qwen2moe", "tp2"),
                                      ("mixtral-fused", "ep2"), ("qwen3moe-gguf", "tp4"), ("ds-v3", "tp2"),
                                      ("ds-v3", "ep4"), ("ds-v2-lite", "tp2")])
def test_info_plan_is_what_the_ranks_hold(kaon_bin, tmp_path, name, par):
    """`kaon info -tp N` computes each rank's weight bytes from the layout alone
    (kaon_tp_plan_bytes); the ranks' start-up lines report the bytes of the shards as cut
    (kaon_tp_shard_bytes). Two computations of one thing: they must agree, rank by rank."""
    import os
    import re
    model = build(tmp_path, name)
    flags = par_flags(par)
    info = run([kaon_bin, "info", model, *flags]).stdout
    planned = [int(x) for x in re.findall(r"rank \d+: .*weights [\d.]+ MiB \((\d+) B\)", info)]
    out = tmp_path / "l.f32"
    r = subprocess.run([str(c) for c in [kaon_bin, "logits", "-m", model, "--prompt-ids", "1,2,3", "-o", out, *flags]],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "KAON_LOG": "info"})
    assert r.returncode == 0, r.stderr
    held = {int(a): int(b) for a, b in re.findall(r"tensor parallel: rank (\d+) of \d+: .*weights [\d.]+ MiB \((\d+) B;",
                                                   r.stderr)}
    n = int(par[2:])
    assert len(planned) == n and sorted(held) == list(range(n)), (info, r.stderr)
    assert planned == [held[i] for i in range(n)]
