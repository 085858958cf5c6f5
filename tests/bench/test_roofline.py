"""bench/roofline.py: the bytes a decode step reads, checked against figures computed by hand
from the configs (the MoE issue's and the DeepSeek issue's numbers)."""
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import roofline  # noqa: E402


def load(name):
    return json.loads((REPO / "bench/configs" / name).read_text())


def test_dense_llama_reads_every_weight():
    cfg = load("meta-llama__Llama-3.1-8B.json")
    w, kv = roofline.step_bytes(cfg, 1)
    # 8.03 B parameters minus all but one embedding row (the LM head is separate), bf16.
    assert w == pytest.approx(2 * (8030261248 - 128256 * 4096 + 4096), rel=1e-9)
    assert kv == 2 * 32 * 2 * 8 * 128  # K and V, 8 KV heads of 128, 32 layers
    # Dense: a batched step reads the same weights.
    assert roofline.step_bytes(cfg, 64)[0] == pytest.approx(w + 2 * 63 * 4096)


def test_moe_batch_touches_nearly_every_expert():
    cfg = load("Qwen__Qwen3-30B-A3B.json")
    assert roofline.experts_touched(128, 8, 1) == pytest.approx(8)
    assert 125 < roofline.experts_touched(128, 8, 64) < 127  # "126 of 128 at batch 64"
    w1, _ = roofline.step_bytes(cfg, 1)
    w64, _ = roofline.step_bytes(cfg, 64)
    assert 6.0e9 < w1 < 6.3e9 and w64 > 9 * w1


def test_deepseek_v2_lite_batch1_bytes():
    cfg = load("deepseek-v2-lite-shape.json")
    w, kv = roofline.step_bytes(cfg, 1)
    assert kv == 2 * 27 * (512 + 64)  # one latent row per layer: 31,104 B/token
    assert 4.85e9 < w + kv * 1024 < 4.95e9  # the issue's ~4.9 GB per token
    s = roofline.shape(cfg)
    assert s["moe_layers"] == 26 and s["top_k"] == 6 and s["shared"] == 3 * 2048 * 1408 * 2


def test_dense_llama_prefill_flops():
    """issue 22's prefill-8k count: 2 x 6.98 B matrix parameters x 8,192 tokens, the LM head on the
    last row only, and causal attention (QK^T and PV over 8,192 x 8,193 / 2 pairs per head)."""
    cfg = load("meta-llama__Llama-3.1-8B.json")
    per_layer = 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    mats = 32 * per_layer
    attn = 4 * 128 * 32 * 32 * 8192 * 8193 / 2
    want = 2 * mats * 8192 + 2 * 128256 * 4096 + attn
    assert roofline.prefill_flops(cfg, 8192) == pytest.approx(want, rel=1e-5)
    assert 131.9e12 < want < 132.0e12
