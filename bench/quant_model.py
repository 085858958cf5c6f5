#!/usr/bin/env python3
"""Writes a random GGUF model for CPU speed measurements: every matrix in one quantized type
(random valid blocks: random payload bytes, f16 scales set so weights stay near +-0.1), norms
f32 ones, token embedding f32. The numbers it computes are meaningless; its shapes and bytes are
those of a real model, which is what `kaon bench latency` times.

    bench/quant_model.py llama --type Q4_K OUT.gguf          # dense: same shape in each type
    bench/quant_model.py qwen3moe --type Q4_K_M OUT.gguf     # Qwen3-30B-A3B widths, few layers

Q4_K_M is the mix llama.cpp's quantizer makes: Q4_K, with Q6_K for attn_v and ffn_down
(llama.cpp picks Q6_K for only some layers' ffn_down; all of them here, the heavier case).
The gguf package cannot quantize the K-quants, hence random blocks (as tests/ref/test_cpu_quant.py).
"""
import argparse

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

# Byte offset of each f16 scale inside a block, with the range it is drawn from.
SCALES = {
    QT.Q4_0: [(0, 0.005, 0.02)], QT.Q4_1: [(0, 0.005, 0.02), (2, -0.1, 0.0)],
    QT.Q5_0: [(0, 0.003, 0.01)], QT.Q8_0: [(0, 0.0005, 0.001)],
    QT.Q2_K: [(80, 0.0005, 0.003), (82, 0.0005, 0.003)], QT.Q3_K: [(108, 0.0005, 0.003)],
    QT.Q4_K: [(0, 0.0005, 0.003), (2, 0.0005, 0.003)], QT.Q5_K: [(0, 0.0003, 0.002), (2, 0.0005, 0.003)],
    QT.Q6_K: [(208, 0.00005, 0.0003)],
}

# Dense shape: a ~45M-parameter Llama (K a multiple of 256 everywhere, for the K-quants).
LLAMA = dict(hidden=1024, ffn=2816, layers=4, heads=16, kv_heads=4, head_dim=64, vocab=8192)
# Qwen3-30B-A3B's widths (shared/configs/Qwen__Qwen3-30B-A3B.json) with fewer layers and a small
# vocabulary, so the experts dominate as they do in the real model.
QWEN3MOE = dict(hidden=2048, ffn=6144, layers=4, heads=32, kv_heads=4, head_dim=128, vocab=8192,
                experts=128, used=8, expert_ffn=768)


def blocks(qt, shape, rng):
    """Random valid blocks for a [*, rows, K] matrix (K = shape[-1]); returns uint8 [..., bytes]."""
    bsz, tsz = gguf.GGML_QUANT_SIZES[qt]
    rows = int(np.prod(shape[:-1]))
    nb = shape[-1] // bsz
    b = rng.integers(0, 256, size=(rows, nb, tsz), dtype=np.uint8)
    for off, lo, hi in SCALES[qt]:
        d = rng.uniform(lo, hi, size=(rows, nb, 1)).astype(np.float16)
        b[:, :, off:off + 2] = d.view(np.uint8).reshape(rows, nb, 2)
    return b.reshape(*shape[:-1], nb * tsz)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("arch", choices=["llama", "qwen3moe"])
    ap.add_argument("out")
    ap.add_argument("--type", default="Q4_K", help="Q4_0 Q4_1 Q5_0 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K, or Q4_K_M")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    c = dict(LLAMA if a.arch == "llama" else QWEN3MOE)
    if a.layers:
        c["layers"] = a.layers
    mixed = a.type == "Q4_K_M"
    base = QT.Q4_K if mixed else QT[a.type]
    heavy = QT.Q6_K if mixed else base  # attn_v, ffn_down
    rng = np.random.default_rng(a.seed)
    H, hd = c["hidden"], c["head_dim"]
    wr = gguf.GGUFWriter(a.out, a.arch)
    wr.add_block_count(c["layers"])
    wr.add_context_length(4096)
    wr.add_embedding_length(H)
    wr.add_feed_forward_length(c["ffn"])
    wr.add_head_count(c["heads"])
    wr.add_head_count_kv(c["kv_heads"])
    wr.add_key_length(hd)
    wr.add_value_length(hd)
    wr.add_layer_norm_rms_eps(1e-6)
    wr.add_rope_freq_base(1e6 if a.arch == "qwen3moe" else 10000.0)
    wr.add_rope_dimension_count(hd)
    wr.add_vocab_size(c["vocab"])
    wr.add_uint32("tokenizer.ggml.bos_token_id", 1)
    wr.add_uint32("tokenizer.ggml.eos_token_id", 2)
    if a.arch == "qwen3moe":
        wr.add_expert_count(c["experts"])
        wr.add_expert_used_count(c["used"])
        wr.add_expert_feed_forward_length(c["expert_ffn"])

    def mat(name, shape, qt):
        raw = blocks(qt, shape, rng)
        wr.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qt)

    def ones(name, n):
        wr.add_tensor(name, np.ones(n, np.float32))

    wr.add_tensor("token_embd.weight", (rng.standard_normal((c["vocab"], H)) * 0.5).astype(np.float32))
    ones("output_norm.weight", H)
    mat("output.weight", (c["vocab"], H), base)
    for l in range(c["layers"]):
        p = f"blk.{l}."
        ones(p + "attn_norm.weight", H)
        ones(p + "ffn_norm.weight", H)
        mat(p + "attn_q.weight", (c["heads"] * hd, H), base)
        mat(p + "attn_k.weight", (c["kv_heads"] * hd, H), base)
        mat(p + "attn_v.weight", (c["kv_heads"] * hd, H), heavy)
        mat(p + "attn_output.weight", (H, c["heads"] * hd), base)
        if a.arch == "llama":
            mat(p + "ffn_gate.weight", (c["ffn"], H), base)
            mat(p + "ffn_up.weight", (c["ffn"], H), base)
            mat(p + "ffn_down.weight", (H, c["ffn"]), heavy)
            continue
        ones(p + "attn_q_norm.weight", hd)
        ones(p + "attn_k_norm.weight", hd)
        E, F = c["experts"], c["expert_ffn"]
        wr.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((E, H)) * 0.05).astype(np.float32))
        mat(p + "ffn_gate_exps.weight", (E, F, H), base)
        mat(p + "ffn_up_exps.weight", (E, F, H), base)
        mat(p + "ffn_down_exps.weight", (E, H, F), heavy)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


if __name__ == "__main__":
    main()
