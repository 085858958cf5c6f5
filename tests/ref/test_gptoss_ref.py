"""gpt-oss (src/model/gptoss.c) on the CPU against the float64 numpy port of transformers'
modeling_gpt_oss.py (gptoss_ref.py): a tiny random checkpoint (4 layers alternating sliding
window 8 / full, 4 experts top 2, YaRN truncate false, sinks, biases) in F32 and BF16;
prefill, decode (one token per step) and chunked prefill over prompts longer than the window.

The port was checked once against transformers 5.17 (CPU torch, float64, eager attention) with
scripts/check_gptoss_ref.py: relative logit error 2.9e-07 (transformers computes
RoPE cos/sin in float32 whatever the model dtype). No torch here.
"""
import numpy as np
import pytest

import kaon_cli
from gptoss_ref import CONFIG, forward, make_weights, save_hf
from logit_checks import assert_logits_match

IDS = [2, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13, 8, 150, 77, 31, 270, 263, 1, 280, 101]
TOL = {"F32": 1e-4, "BF16": 1e-4}  # the reference computes with the bf16-rounded weights


@pytest.mark.parametrize("fmt", ["F32", "BF16"])
def test_logits_match_reference(kaon_bin, tmp_path, fmt):
    model, w = save_hf(tmp_path / f"gptoss-{fmt}", make_weights(), fmt)
    ref = forward(CONFIG, w, IDS)
    for mode in ("prefill", "decode", "chunk5"):
        ours = kaon_cli.logits(kaon_bin, model, IDS, tmp_path, mode)
        assert_logits_match(ours, ref, TOL[fmt], f"gpt-oss {fmt} {mode}")


def test_sinks_and_clamps_matter():
    """The reference's special parts change the logits (a port that dropped them would differ)."""
    w = make_weights()
    base = forward(CONFIG, w, IDS[:12])
    w2 = dict(w, **{f"model.layers.{l}.self_attn.sinks": w[f"model.layers.{l}.self_attn.sinks"] + 3 for l in range(4)})
    assert np.abs(forward(CONFIG, w2, IDS[:12]) - base).max() > 1e-3
    big = forward(dict(CONFIG, swiglu_limit=1e9), w, IDS[:12])
    assert np.abs(big - base).max() > 1e-3
