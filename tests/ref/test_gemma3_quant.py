"""Gemma 3 in a Q4_K_M-style GGUF of mixed types, as llama.cpp's quantizer lays out the real
gemma-3-270m Q4_K_M file (Q8_0 embeddings, Q5_0 q/k/gate/up, Q8_0 or Q5_0 v, Q4_K attention
output, Q4_K or Q6_K ffn_down, F32 norms): kaon's logits against the numpy float64 reference on
the values the file stores (dequantized by the `gguf` package).

Q5_0 and Q8_0 come from gguf.quants.quantize of the random weights; the K-quants, which the
package cannot quantize, are random valid blocks (quant_blocks.py). Gemma's norms after every
attention and MLP output keep the random blocks' larger magnitudes harmless.

Tolerance: kaon quantizes the activations of every quantized linear to int8 blocks (each value
moves by at most max|x_block| / 254; test_cpu_quant.py checks each linear against that rigorous
bound), which the float64 reference does not. About 0.5% per linear, over 7 layers of 4-5
linears and the LM head: relative logit errors of 2.7e-2 measured with Q5_0/Q8_0 alone, 1.7e-2
with the K-quants alone, 3.2e-2 with all (2026-12-02). The bound is 6e-2; a misread block or
a wrong type gives errors of order 1 (the F32 file of the same weights: 6e-7).
"""
import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

import kaon_cli
from gemma3_models import load_gguf, make_config, make_weights, save_gguf
from gemma3_ref import Gemma3Ref
from logit_checks import assert_logits_match, first_divergence, greedy
from quant_blocks import random_blocks

# 37 ids: several sliding windows of 8; specials, byte tokens and pieces.
IDS = [2, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13, 8, 150, 77, 31,
       270, 263, 1, 280, 101, 102, 33, 33, 33, 290, 6, 261, 262, 180, 44, 9, 298]
TOL = 6e-2

# The 270M's attention layout (head_dim 256 on one KV head is covered by test_gemma3_ref's
# hd256; here every K is a multiple of 256, as the K-quants need).
CONFIG = dict(make_config("tiny"), hidden_size=256, intermediate_size=512, num_attention_heads=4,
              num_key_value_heads=1, head_dim=64, query_pre_attn_scalar=64)


def q4_k_m_type(name, layer):
    """The type llama.cpp's Q4_K_M recipe gave each tensor of the real 270M file (where a
    tensor's rows are not a multiple of 256 it falls back to Q5_0; here some are kept Q4_K)."""
    kind = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
    if name.endswith("norm.weight"):
        return None
    if kind == "token_embd":
        return QT.Q8_0
    if kind == "attn_v":
        return QT.Q8_0 if layer % 3 == 0 else QT.Q5_0
    if kind == "attn_output":
        return QT.Q4_K
    if kind == "ffn_down":
        return QT.Q6_K if layer % 3 == 0 else QT.Q4_K
    return QT.Q5_0  # attn_q, attn_k, ffn_gate, ffn_up


def make_encoder(seed):
    rng = np.random.default_rng(seed)

    def encode(name, a):
        layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
        qt = q4_k_m_type(name, layer)
        if qt is None:
            return a, None
        if qt in (QT.Q4_K, QT.Q6_K):
            return random_blocks(qt, a.shape[0], a.shape[1], rng), qt
        return quantize(a, qt), qt
    return encode


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    cfg = json_copy(CONFIG)
    path = save_gguf(tmp_path_factory.mktemp("gemma3q") / "gemma3-q4_k_m.gguf", cfg, make_weights(cfg, seed=7),
                     encode=make_encoder(8))
    cfg2, w2 = load_gguf(path)  # the stored values, as llama.cpp reads them
    return path, cfg2, w2


def json_copy(d):
    import json
    return json.loads(json.dumps(d))


def test_file_has_the_mixed_types(model):
    types = {t.tensor_type for t in gguf.GGUFReader(str(model[0])).tensors}
    assert types == {QT.F32, QT.Q8_0, QT.Q5_0, QT.Q4_K, QT.Q6_K}


def test_logits(kaon_bin, tmp_path, model):
    path, cfg, w = model
    ref = Gemma3Ref(cfg, w, embed_scale="f32").forward(IDS)
    for mode in ("prefill", "decode", "chunk5"):
        got = kaon_cli.logits(kaon_bin, path, IDS, tmp_path, mode)
        assert_logits_match(got, ref, TOL, f"Q4_K_M-style {mode}")


# Greedy may flip where the reference's top two are closer than twice the largest logit
# deviation (0.25 measured on these logits): each of the two can move by that much.
NEAR_TIE = 0.5


def test_greedy_run(kaon_bin, model):
    """`kaon run --temp 0` follows the reference; a divergence only at a near-tie."""
    path, cfg, w = model
    prompt, n = IDS[:21], 24
    want, margins = greedy(Gemma3Ref(cfg, w, embed_scale="f32"), prompt, n)
    got = kaon_cli.greedy(kaon_bin, path, prompt, n)
    print(f"Q4_K_M-style: kaon {got}\n              ref  {want}")
    assert len(got) == n
    first = first_divergence(got, want)
    if first is not None:
        assert margins[first] < NEAR_TIE, (first, got[first], want[first], margins[first])
