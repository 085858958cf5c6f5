"""Tensor parallelism on the CPU (--tensor-parallel-size N: N worker threads, each with its shard
of the weights and its KV heads, src/model/tp.c; the CPU communicator, src/dist/comm_cpu.c)
against one rank, on tiny random checkpoints (tiny_models.py) and the default SmolLM2 Q4_1 file.

What must hold: the same greedy ids as one rank, and logits within f32 reduction-order bounds.
Sharding changes only the order of the sums of the row-parallel layers (o_proj, down_proj: each
rank sums its columns, then the ranks' partial sums are added in rank order) and nothing else
(every other op sees the same values; the LM head's slices are gathered, not summed). Each
such dot product of K terms moves by a few ulps of its terms' magnitude (|error| <= K eps
sum|terms| in the worst case, ~sqrt(K) eps in practice), and the residual stream carries it on,
so the bound used here is |logit difference| <= 1e-4 x max(1, max|logit|): roughly 1000 ulps of
f32 at the logits' scale, far below what a real sharding bug (a wrong head, a missing partial
sum: differences of order 1) gives, and far above the 1e-6 the tiny models show.

Formats whose CPU kernels quantize the activations (GGUF Q4_1, Q8_0, ...: 8-bit blocks of x,
cpu_linear.c) are not bound by f32 reduction order: a 1-ulp change of x flips an occasional
round(x / d) by one step (d = max|block| / 127), a jump of about 1% of that element, which later
layers and the KV cache carry on. SmolLM2 Q4_1 at TP 3 shows max |diff| 0.8 on logits of ~30
(relative L2 per position <= 0.09), while the same file dequantized to F32 shows 6e-5 (inside
the f32 bound above): the sharding is exact, the kernels' rounding is not. Those tests check the
argmax of every position, the relative L2 error (QREL) and greedy ids over 16 tokens (SmolLM2
Q4_1 at TP 3 first differs from one rank at generated token 23).

Uneven splits (heads, KV heads, FFN width not divisible, block formats cut off their blocks)
are refused with exit status 2 and one error line.
"""
import json
import random
import subprocess

import numpy as np
import pytest

from conftest import DEFAULT_MODEL
from tiny_models import make_config, make_weights, save_gguf, save_hf

IDS = [1, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13, 8, 150, 77, 31]
REL = 1e-4
QREL = 0.15


def run(cmd, ok=True):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def logits(exe, model, tmp_path, tp, ids=IDS, mode="prefill"):
    return kaon_logits(exe, model, tmp_path, ["--tensor-parallel-size", tp], tp, ids, mode)


def kaon_logits(exe, model, tmp_path, flags, tag, ids=IDS, mode="prefill", threads=1):
    """`kaon logits` of ids with extra flags (prefill, --decode or --chunk N): [len(ids), vocab]."""
    out = tmp_path / f"l-{tag}-{mode}.f32"
    cmd = [exe, "logits", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-o", out, "--threads",
           str(threads), *flags]
    if mode == "decode":
        cmd.append("--decode")
    elif mode.startswith("chunk"):
        cmd += ["--chunk", mode[5:]]
    run(cmd)
    a = np.fromfile(out, dtype=np.float32)
    out.unlink()
    return a.reshape(len(ids), -1)


def check_close(ours, ref, what):
    diff = float(np.abs(ours - ref).max())
    bound = REL * max(1.0, float(np.abs(ref).max()))
    print(f"{what}: max |logit diff| {diff:.3g} (bound {bound:.3g})")
    assert diff <= bound, what
    assert (ours.argmax(-1) == ref.argmax(-1)).all(), what


def check_quantized(ours, ref, what):
    rel = np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    print(f"{what}: max |logit diff| {float(np.abs(ours - ref).max()):.3g}, relative L2 per position <= {rel.max():.3g}")
    assert rel.max() <= QREL, what
    assert (ours.argmax(-1) == ref.argmax(-1)).all(), what


def tiny_cfg(arch, **over):
    cfg = make_config(arch)
    cfg.update(over)
    return cfg


# Tiny models: 4 Q heads, 2 KV heads: TP 2 splits both, TP 4 replicates each KV head on two ranks.
@pytest.fixture(scope="module", params=["llama", "qwen3", "llama-gguf", "qwen2-bf16"])
def tiny(tmp_path_factory, request):
    d = tmp_path_factory.mktemp("tp")
    name = request.param
    arch = name.split("-")[0]
    cfg = tiny_cfg(arch)
    w = make_weights(cfg, seed=11)
    if name.endswith("gguf"):
        return save_gguf(d / f"{arch}.gguf", cfg, w)
    return save_hf(d / name, cfg, w, "BF16" if name.endswith("bf16") else "F32")


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("mode", ["prefill", "decode", "chunk7"])
def test_logits_match_one_rank(kaon_bin, tiny, tmp_path, tp, mode):
    ref = logits(kaon_bin, tiny, tmp_path, 1, mode=mode)
    check_close(logits(kaon_bin, tiny, tmp_path, tp, mode=mode), ref, f"{tiny.name} TP {tp} {mode}")


def generate(exe, model, tmp_path, prompts, tp, extra=(), name="run"):
    inp, out = tmp_path / f"{name}-{tp}.in.jsonl", tmp_path / f"{name}-{tp}.out.jsonl"
    inp.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
    r = run([exe, "generate", "-m", model, "--input", inp, "--output", out, "--threads", "2", "--quiet",
             "--temp", "0", "--max-tokens", "12", "--ignore-eos", "-tp", tp, *extra])
    stats = json.loads(r.stderr.split("kaon-stats: ", 1)[1].splitlines()[0])
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    return [row["token_ids"] for row in rows], stats


def prompts(n, seed, prefix=0):
    rng = random.Random(seed)
    pre = [rng.randrange(3, 300) for _ in range(prefix)]
    return [pre + [rng.randrange(3, 300) for _ in range(rng.randrange(3, 40))] for _ in range(n)]


@pytest.mark.parametrize("tp", [2, 4])
def test_batched_chunked_greedy_ids(kaon_bin, tiny, tmp_path, tp):
    ps = prompts(16, seed=tp)
    extra = ["--max-num-seqs", "8", "--max-num-batched-tokens", "24", "--no-prefix-caching"]
    one, _ = generate(kaon_bin, tiny, tmp_path, ps, 1, extra)
    many, st = generate(kaon_bin, tiny, tmp_path, ps, tp, extra)
    assert many == one
    assert st["steps"] < 16 * 12  # really batched


def test_prefix_cache_hits(kaon_bin, tiny, tmp_path):
    ps = prompts(8, seed=9, prefix=40)
    one, _ = generate(kaon_bin, tiny, tmp_path, ps, 1, ["--max-num-seqs", "1", "--no-prefix-caching"], name="nc")
    cached, st = generate(kaon_bin, tiny, tmp_path, ps, 2, ["--max-num-seqs", "1"], name="pc")
    assert st["prefix_hit_tokens"] >= 7 * 32, st
    assert cached == one


# ---- GGUF Q8_0: rows cut on blocks of 32 ---------------------------------------------------

def save_q8_0(path, cfg, w):
    import gguf
    from gguf.quants import quantize

    real = gguf.GGUFWriter.add_tensor

    def add_tensor(self, name, arr, *a, **k):
        if arr.ndim == 2 and "norm" not in name and not k.get("raw_dtype"):
            return real(self, name, quantize(np.ascontiguousarray(arr, dtype=np.float32), gguf.GGMLQuantizationType.Q8_0),
                        raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        return real(self, name, arr, *a, **k)

    gguf.GGUFWriter.add_tensor = add_tensor
    try:
        return save_gguf(path, cfg, w)
    finally:
        gguf.GGUFWriter.add_tensor = real


@pytest.mark.parametrize("tp", [2, 4])
def test_gguf_q8_0(kaon_bin, tmp_path, tp):
    # o_proj's 128 and down's 256 columns cut into 64 / 32 and 128 / 64: whole blocks.
    cfg = tiny_cfg("qwen3", hidden_size=128, intermediate_size=256, head_dim=32)
    model = save_q8_0(tmp_path / "q8.gguf", cfg, make_weights(cfg, seed=3))
    ref = logits(kaon_bin, model, tmp_path, 1)
    check_quantized(logits(kaon_bin, model, tmp_path, tp), ref, f"Q8_0 TP {tp}")


def test_gguf_q8_0_off_block_refused(kaon_bin, tmp_path):
    # down_proj's 96 columns over 2 ranks: 48, not a whole number of 32-element blocks.
    cfg = tiny_cfg("qwen3", hidden_size=128, intermediate_size=96, head_dim=32)
    model = save_q8_0(tmp_path / "q8b.gguf", cfg, make_weights(cfg, seed=3))
    refused(kaon_bin, model, tmp_path, 2, "blocks")


# ---- refusals ------------------------------------------------------------------------------

def refused(exe, model, tmp_path, tp, words):
    r = run([exe, "logits", "-m", model, "--prompt-ids", "1,2,3", "-o", tmp_path / "x.f32", "-tp", tp], ok=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and words in lines[0] and "tensor parallel" in lines[0], r.stderr


@pytest.mark.parametrize("over,tp,words", [
    ({}, 3, "attention heads"),                                            # 4 heads over 3
    ({"num_attention_heads": 6, "num_key_value_heads": 3, "head_dim": 16}, 2, "KV heads"),  # 3 KV heads over 2
    ({"intermediate_size": 90}, 4, "intermediate_size"),                   # 90 over 4
])
def test_uneven_splits_refused(kaon_bin, tmp_path, over, tp, words):
    cfg = tiny_cfg("llama", **over)
    model = save_hf(tmp_path / "m", cfg, make_weights(cfg, seed=1), "F32")
    refused(kaon_bin, model, tmp_path, tp, words)


# ---- the default model: SmolLM2-135M Q4_1 (9 Q heads, 3 KV heads, FFN 1536) ---------------

def test_smollm2_q4_1(kaon_bin, tmp_path):
    if not DEFAULT_MODEL.exists():
        pytest.fail(f"default model missing at {DEFAULT_MODEL}: run scripts/setup.sh")
    ids = [1, 504, 3458, 282, 4649, 314]  # "The capital of France is" (whole-word ids)
    ref = logits(kaon_bin, DEFAULT_MODEL, tmp_path, 1, ids=ids)
    check_quantized(logits(kaon_bin, DEFAULT_MODEL, tmp_path, 3, ids=ids), ref, "SmolLM2 Q4_1 TP 3")
    g = lambda tp: json.loads(run([kaon_bin, "run", "-m", DEFAULT_MODEL, "--prompt-ids", ",".join(map(str, ids)),
                                   "-n", 16, "--temp", 0, "--ignore-eos", "--print-ids", "--threads", 2, "-tp", tp]
                                  ).stdout.strip().splitlines()[-1])
    assert g(3) == g(1)
    refused(kaon_bin, DEFAULT_MODEL, tmp_path, 2, "9 attention heads")
