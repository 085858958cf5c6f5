"""Tensor parallelism on the CUDA backend (src/model/tp.c with CUDA ranks): -tp N against -tp 1 on
CUDA, on tiny random bf16 checkpoints (tests/ref/tiny_models.py, sized for the CUDA kernels:
head_dim 64 / 128, a vocabulary of 1024 that splits into slices of whole 8-row groups).

Two ways to place the ranks:
- same: KAON_TP_SAME_DEVICE=1, every rank a thread on GPU 0 with the same-device communicator
  (src/dist/comm_cuda_local.cu, graphs off): the sharding checked on one GPU;
- nccl: rank r on GPU r, NCCL between them, graphs on; skipped unless N GPUs are visible.

Random weights (--load-format dummy, created by each rank on its device) are held to the same
bounds: a rank's shard takes the whole tensor's values, so every layout computes the same model.

What must hold. Sharding changes the order of the row-parallel sums (o_proj, down_proj), and on
CUDA each rank's partial sum is rounded to bf16 before the ranks' sum (one more rounding than one
rank's GEMM): differences of a few bf16 ulps in the residual stream, carried on by later layers.
So logits are held to a relative L2 error per position (REL, the bound of bf16 model tests)
and the same argmax wherever one rank's top-2 margin is clear (> MARGIN); greedy ids must be the
same, except that a sequence may part from one rank's where one rank's own logits nearly tie
(the two tokens within TIE, on logits of standard deviation ~1 whose top-2 gaps are often
0.05 to 0.3 in these random models): a real sharding bug gives differences of order 1 everywhere.

Expert parallelism (the tests named test_ep_*: -k ep): tiny Qwen3-MoE / Qwen2-MoE checkpoints
(tests/ref/moe_models.py, per-expert and transformers 5's fused expert layouts, a dense first
layer, Qwen2-MoE's gated shared expert split like a dense MLP) with --enable-expert-parallel: each
rank uploads and runs its range of whole experts (model/moe.c, cuda_moe.cu), the router replicated.
Routing adds a hazard the dense tests do not have: the ranks' hidden states differ from one rank's
by a few bf16 ulps, so a token whose k-th and (k+1)-th router logits nearly tie may take another
expert, which moves its row (and later positions through attention) by far more than REL. The
models held to the dense tests' bounds therefore route every token to every expert (top-k = E:
nothing to flip, while the ranges, offsets and the sum over ranks are all exercised); a top-4 of
16 model (tokens with no local expert on a rank, the combine's zero rows) is held to the median
position and most positions within REL. The op-level checks of expert ranges, exact zeros
included, are tests/gpu/test_gpu_moe.py's test_moe_op_expert_range. MLA (DeepSeek) does not run
tensor parallel on CUDA yet, so no DeepSeek model here.

    KAON_BUILD=build-gpu python3 -m pytest -q tests/gpu/test_tp_cuda.py [-k same | -k nccl | -k ep]
"""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KAON_BUILD", REPO / "build-gpu"))
sys.path.insert(0, str(REPO / "tests" / "ref"))
from moe_models import fuse_experts, make_moe_config, make_moe_weights  # noqa: E402
from tiny_models import make_config, make_weights, save_hf  # noqa: E402

# KAON_TP_SIZES="2,4" (the default): the rank counts tested (bench/multigpu.sh N: just N).
TPS = [int(x) for x in os.environ.get("KAON_TP_SIZES", "2,4").split(",") if x.strip()]
REL = 1.5e-2
MARGIN = 0.1
TIE = 0.1


def n_gpus():
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    gpus = [l for l in r.stdout.splitlines() if l.startswith("GPU ")]
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    return min(len(gpus), len([v for v in vis.split(",") if v.strip()])) if vis else len(gpus)


def kaon():
    exe = BUILD / "kaon"
    if not exe.exists():
        pytest.fail(f"kaon not found at {exe}: build with CUDA first (tests/gpu/run_all.sh build) or set KAON_BUILD")
    return exe


def env_for(place):
    env = dict(os.environ, KAON_LOG="info")  # the ranks' start-up lines
    env.pop("KAON_TP_SAME_DEVICE", None)
    if place == "same":
        env["KAON_TP_SAME_DEVICE"] = "1"
    return env


def run(cmd, place, ok=True):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, env=env_for(place))
    if ok:
        assert r.returncode == 0, r.stderr[-4000:]
    return r


def needs(place, tp):
    if place == "nccl" and n_gpus() < tp:
        pytest.skip(f"NCCL between devices: {tp} GPUs needed, {n_gpus()} visible")
    if place == "same" and n_gpus() < 1:
        pytest.fail("no GPU")


# Llama: 8 Q heads, 2 KV heads (TP 4 replicates each KV head on two ranks); Qwen3: 8 / 4 with q/k norms.
@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny(tmp_path_factory, request):
    arch = request.param
    cfg = make_config(arch)
    cfg.update(hidden_size=512, intermediate_size=1024, num_attention_heads=8, vocab_size=1024,
               num_key_value_heads=2 if arch == "llama" else 4, head_dim=64 if arch == "llama" else 128,
               max_position_embeddings=4096)
    return save_hf(tmp_path_factory.mktemp("tpcuda") / arch, cfg, make_weights(cfg, seed=5), "BF16")


IDS = [1, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13, 8, 150, 77, 31, 900, 1000, 512, 3]


def logits(model, tmp_path, tp, place, ids=IDS, mode="prefill", extra=()):
    out = tmp_path / f"l-{tp}-{place}-{mode}.f32"
    cmd = [kaon(), "logits", "-m", model, "--device", "cuda", "--prompt-ids", ",".join(map(str, ids)), "-o", out,
           "--tensor-parallel-size", tp, *extra]
    if mode == "decode":
        cmd.append("--decode")
    elif mode.startswith("chunk"):
        cmd += ["--chunk", mode[5:]]
    r = run(cmd, place if tp > 1 else "one")
    a = np.fromfile(out, dtype=np.float32)
    out.unlink()
    return a.reshape(len(ids), -1), r.stderr


def check_close(ours, ref, what):
    rel = np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    srt = np.sort(ref, axis=-1)
    clear = srt[:, -1] - srt[:, -2] > MARGIN
    same = (ours.argmax(-1) == ref.argmax(-1))[clear]
    print(f"{what}: relative L2 per position <= {rel.max():.3g}, max |diff| {float(np.abs(ours - ref).max()):.3g}, "
          f"argmax equal at {int(same.sum())} of {int(clear.sum())} clear positions")
    assert rel.max() <= REL, what
    assert same.all(), what


@pytest.mark.parametrize("place", ["same", "nccl"])
@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("mode", ["prefill", "decode", "chunk7"])
def test_logits_match_one_rank(tiny, tmp_path, place, tp, mode):
    needs(place, tp)
    ref, _ = logits(tiny, tmp_path, 1, place, mode=mode)
    ours, err = logits(tiny, tmp_path, tp, place, mode=mode)
    assert "tensor parallel: rank 1 of" in err  # the ranks' plans are printed at start-up
    check_close(ours, ref, f"{tiny.name} TP {tp} ({place}) {mode}")


@pytest.fixture(scope="module")
def dummy_config(tmp_path_factory):
    """A small Llama config.json alone: --load-format dummy makes random weights of its shapes."""
    cfg = make_config("llama")
    cfg.update(hidden_size=512, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
               vocab_size=1024, num_hidden_layers=2, max_position_embeddings=4096)
    path = tmp_path_factory.mktemp("tpdummy") / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("place", ["same", "nccl"])
@pytest.mark.parametrize("tp", TPS)
def test_dummy_weights_same_across_layouts(dummy_config, tmp_path, place, tp):
    """Each rank creates its shard's dummy weights on its device with the values (and scale) of
    their places in the whole tensors, so -tp N computes the same model as -tp 1: shards seeded
    by their own shapes would give logits of an unrelated model (relative error ~1)."""
    needs(place, tp)
    dummy = ["--load-format", "dummy"]
    ref, _ = logits(dummy_config, tmp_path, 1, place, extra=dummy)
    ours, err = logits(dummy_config, tmp_path, tp, place, extra=dummy)
    assert "tensor parallel: rank 1 of" in err
    check_close(ours, ref, f"dummy llama TP {tp} ({place})")


def generate(model, tmp_path, prompts, tp, place, extra=()):
    inp, out = tmp_path / f"g-{tp}-{place}.in.jsonl", tmp_path / f"g-{tp}-{place}.out.jsonl"
    inp.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
    r = run([kaon(), "generate", "-m", model, "--device", "cuda", "--input", inp, "--output", out, "--quiet",
             "--temp", "0", "--max-tokens", "12", "--ignore-eos", "-tp", tp, *extra], place if tp > 1 else "one")
    stats = json.loads(r.stderr.split("kaon-stats: ", 1)[1].splitlines()[0])
    return [json.loads(l)["token_ids"] for l in out.read_text().splitlines()], stats


def prompts(n, seed):
    rng = random.Random(seed)
    return [[rng.randrange(3, 1000) for _ in range(rng.randrange(3, 40))] for _ in range(n)]


def near_tie(model, tmp_path, prompt, a, b):
    """One rank's logits after prompt: tokens a and b within TIE of each other."""
    l, _ = logits(model, tmp_path, 1, "one", ids=prompt)
    gap = abs(float(l[-1, a]) - float(l[-1, b]))
    print(f"parted at a near-tie? |logit {a} - logit {b}| = {gap:.3g}")
    return gap <= TIE


def check_greedy(model, tmp_path, place, tp, flags=(), what="TP"):
    ps = prompts(16, seed=tp)
    extra = ["--max-num-seqs", "8", "--max-num-batched-tokens", "24", "--no-prefix-caching",
             "--kv-cache-memory", "64"]
    one, _ = generate(model, tmp_path, ps, 1, place, extra)
    many, st = generate(model, tmp_path, ps, tp, place, [*extra, *flags])
    assert st["steps"] < 16 * 12  # really batched
    parted = 0
    for p, a, b in zip(ps, one, many):
        if a == b:
            continue
        k = next(i for i in range(len(a)) if a[i] != b[i])
        assert near_tie(model, tmp_path, p + a[:k], a[k], b[k]), f"{what} {tp} ({place}) parted from one rank at token {k}"
        parted += 1
    print(f"{what} {tp} ({place}): {16 - parted} of 16 sequences equal to one rank's, {parted} parted at near-ties")
    assert parted <= 8  # each parting was checked above; most sequences must not part at all


@pytest.mark.parametrize("place", ["same", "nccl"])
@pytest.mark.parametrize("tp", TPS)
def test_batched_chunked_greedy_ids(tiny, tmp_path, place, tp):
    needs(place, tp)
    check_greedy(tiny, tmp_path, place, tp)


def test_refused_with_one_line(tmp_path):
    """MoE, MLA, quantized and DP attention on CUDA are refused with one error line (exit 2)."""
    if n_gpus() < 1:
        pytest.fail("no GPU")
    cfg = make_config("llama")
    cfg.update(hidden_size=512, intermediate_size=1024, num_attention_heads=8, vocab_size=1024, head_dim=64)
    model = save_hf(tmp_path / "llama", cfg, make_weights(cfg, seed=1), "BF16")
    r = run([kaon(), "logits", "-m", model, "--device", "cuda", "--prompt-ids", "1,2,3", "-o", tmp_path / "o",
             "-tp", "2", "--kv-cache-dtype", "fp8"], "same", ok=False)
    assert r.returncode != 0 and "tensor parallel on CUDA" in r.stderr, r.stderr


# ---- expert parallelism (--enable-expert-parallel) -----------------------------------------------

EP = ["--enable-expert-parallel"]


def moe_config(name):
    """Tiny MoE configurations sized for the CUDA kernels (dims multiples of 8, head_dim 64, a
    vocabulary of 1024). name: ARCH[-fused]-all (top-k = every expert) or qwen3moe-top4."""
    arch = name.split("-")[0]
    cfg = make_moe_config(arch)
    cfg.update(hidden_size=512, intermediate_size=1024, num_attention_heads=8, head_dim=64, vocab_size=1024,
               max_position_embeddings=4096, moe_intermediate_size=256, tie_word_embeddings=False)
    if arch == "qwen3moe":
        cfg.update(num_key_value_heads=4)
    else:  # qwen2moe: 2 KV heads (replicated at EP 4), a gated shared expert of 512 (128 per rank at 4)
        cfg.update(num_key_value_heads=2, shared_expert_intermediate_size=512)
    if name.endswith("-all"):
        # 8 experts (EP 2: 4 each, EP 4: 2 each) or 6 (EP 4 uneven: [0, 1), [1, 3), [3, 4), [4, 6)).
        E = 6 if "fused" in name or arch == "qwen2moe" else 8
        cfg.update(num_experts=E, num_experts_per_tok=E)
    else:
        cfg.update(num_experts=16, num_experts_per_tok=4)
    return cfg


@pytest.fixture(scope="module", params=["qwen3moe-all", "qwen3moe-fused-all", "qwen2moe-all"])
def moe_all(tmp_path_factory, request):
    cfg = moe_config(request.param)
    w = make_moe_weights(cfg, seed=7)
    if "fused" in request.param:
        w = fuse_experts(cfg, w)  # one gate_up source: a rank's rows are a middle run of it
    return save_hf(tmp_path_factory.mktemp("tpep") / request.param, cfg, w, "BF16")


@pytest.fixture(scope="module")
def moe_top4(tmp_path_factory):
    cfg = moe_config("qwen3moe-top4")
    return save_hf(tmp_path_factory.mktemp("tpep") / "qwen3moe-top4", cfg, make_moe_weights(cfg, seed=7), "BF16")


def ep_logits(model, tmp_path, tp, place, mode, extra=()):
    ours, err = logits(model, tmp_path, tp, place, mode=mode, extra=[*EP, *extra])
    assert "tensor parallel: rank 1 of" in err and "rank 1: expert parallel: experts [" in err, err[-2000:]
    return ours


@pytest.mark.parametrize("place", ["same", "nccl"])
@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("mode", ["prefill", "decode", "chunk7"])
def test_ep_logits_match_one_rank(moe_all, tmp_path, place, tp, mode):
    """Every token on every expert: the dense tests' bounds. prefill (24 tokens in one step): the
    routing, plan and permutation kernels and the grouped GEMM; decode and chunk7 (steps of 1 and
    of 7 tokens, the last of 3): the small-batch kernels (k_moe_route_small's plan of the rank's
    experts). The batched greedy test below runs steps of up to 24 tokens of several sequences."""
    needs(place, tp)
    ref, _ = logits(moe_all, tmp_path, 1, place, mode=mode)
    check_close(ep_logits(moe_all, tmp_path, tp, place, mode), ref, f"{moe_all.name} EP {tp} ({place}) {mode}")


@pytest.mark.parametrize("place", ["same", "nccl"])
@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("mode", ["prefill", "decode", "chunk7"])
def test_ep_top4_of_16_logits(moe_top4, tmp_path, place, tp, mode):
    """Top-4 of 16: many tokens have none of a rank's experts (its combine gives them 0). Near-tie
    routing may move a few positions (module docstring); a wrong range or offset moves most."""
    needs(place, tp)
    ref, _ = logits(moe_top4, tmp_path, 1, place, mode=mode)
    ours = ep_logits(moe_top4, tmp_path, tp, place, mode)
    rel = np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    srt = np.sort(ref, axis=-1)
    clear = srt[:, -1] - srt[:, -2] > MARGIN
    same = (ours.argmax(-1) == ref.argmax(-1))[clear]
    within = float((rel <= REL).mean())
    print(f"qwen3moe top-4 of 16 EP {tp} ({place}) {mode}: relative L2 per position median {np.median(rel):.3g}, "
          f"max {rel.max():.3g}, {within:.0%} of positions within {REL}; argmax equal at {int(same.sum())} of "
          f"{int(clear.sum())} clear positions")
    assert np.median(rel) <= REL
    assert within >= 0.75
    assert same.size == 0 or same.mean() >= 0.9


@pytest.mark.parametrize("place", ["same", "nccl"])
@pytest.mark.parametrize("tp", TPS)
def test_ep_batched_chunked_greedy_ids(moe_all, tmp_path, place, tp):
    needs(place, tp)
    check_greedy(moe_all, tmp_path, place, tp, EP, what="EP")


@pytest.fixture(scope="module")
def moe_dummy_config(tmp_path_factory):
    """qwen3moe-all's config.json alone: --load-format dummy makes random weights of its shapes."""
    path = tmp_path_factory.mktemp("tpepdummy") / "config.json"
    path.write_text(json.dumps(moe_config("qwen3moe-all")))
    return path


@pytest.mark.parametrize("place", ["same", "nccl"])
@pytest.mark.parametrize("tp", TPS)
def test_ep_dummy_weights_same_across_layouts(moe_dummy_config, tmp_path, place, tp):
    """Each rank creates only its experts' rows of the stacked dummy expert tensors, with the
    values of those rows in the whole (model/moe.c gives the device their origin): -tp N computes
    the same model as -tp 1."""
    needs(place, tp)
    dummy = ["--load-format", "dummy"]
    ref, _ = logits(moe_dummy_config, tmp_path, 1, place, extra=dummy)
    check_close(ep_logits(moe_dummy_config, tmp_path, tp, place, "prefill", dummy), ref, f"dummy qwen3moe EP {tp} ({place})")


def test_ep_what_is_refused(tmp_path):
    """On CUDA a MoE model needs --enable-expert-parallel (experts split over their FFN columns
    are CPU-only), and dummy weights with a shared expert are refused: one line, exit status 2."""
    if n_gpus() < 1:
        pytest.fail("no GPU")
    model = save_hf(tmp_path / "qwen3moe-top4", moe_config("qwen3moe-top4"),
                    make_moe_weights(moe_config("qwen3moe-top4"), seed=1), "BF16")
    shared = tmp_path / "shared" / "config.json"
    shared.parent.mkdir()
    shared.write_text(json.dumps(moe_config("qwen2moe-all")))
    for m, extra, words in ((model, [], "--enable-expert-parallel"),
                            (shared, [*EP, "--load-format", "dummy"], "dummy with a shared expert")):
        r = run([kaon(), "logits", "-m", m, "--device", "cuda", "--prompt-ids", "1,2,3", "-o", tmp_path / "o",
                 "-tp", "2", *extra], "same", ok=False)
        lines = [l for l in r.stderr.strip().splitlines() if "tensor parallel on CUDA" in l]
        assert r.returncode == 2 and lines and words in lines[-1], r.stderr[-3000:]
