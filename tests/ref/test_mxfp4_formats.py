"""MXFP4 checkpoints (gpt-oss's *_blocks / *_scales) on the CPU: kaon repacks them at load into
its one MXFP4 layout, and its logits equal those of the same model written with the dequantized
weights in F32 (f32 rounding only), for dense Linears and for stacked experts (transformers 5's
experts.gate_up_proj / down_proj). Swapped nibbles move the logits far past that bound;
modules_to_not_convert and bad tensors are clear errors."""
import subprocess

import numpy as np
import pytest

from hf_files import write_folder
from kaon_cli import logits
from mxfp4_files import quantize_checkpoint
from tiny_models import make_config, make_weights

IDS = [1, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5]
BOUND = 1e-5
NOT_CONVERT = ["model.embed_tokens", "lm_head"]


def dense_config():
    cfg = make_config("llama")
    cfg.update(hidden_size=160, intermediate_size=288, num_attention_heads=4, num_key_value_heads=2)
    return cfg


def is_linear(n):
    return n.endswith("_proj.weight")


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def write_pair(tmp_path, cfg, w, quantized, not_convert=NOT_CONVERT, swap=False, tag="q"):
    qc, files, deq = quantize_checkpoint(w, quantized, not_convert, swap)
    q = write_folder(tmp_path / tag, dict(cfg, quantization_config=qc), files, "F32", indent=None)
    f = write_folder(tmp_path / (tag + "-f32"), cfg, deq, "F32", indent=None)
    return q, f, files


def kaon_info(kaon_bin, model):
    return subprocess.run([str(kaon_bin), "info", str(model)], capture_output=True, text=True, timeout=60)


def test_mxfp4_dense_logits(kaon_bin, tmp_path):
    cfg = dense_config()
    qdir, fdir, files = write_pair(tmp_path, cfg, make_weights(cfg, 3), is_linear)
    assert "model.layers.0.self_attn.q_proj.weight_blocks" in files
    for mode in ("prefill", "decode"):
        ours, want = logits(kaon_bin, qdir, IDS, tmp_path, mode), logits(kaon_bin, fdir, IDS, tmp_path, mode)
        err = rel_err(ours, want)
        print(f"dense {mode}: relative logit error {err:.2e} vs kaon F32")
        assert err < BOUND
        assert (ours.argmax(-1) == want.argmax(-1)).all()


def test_mxfp4_swapped_nibbles_fail(kaon_bin, tmp_path):
    # The bound means something: the same codes with each byte's nibbles swapped.
    cfg = dense_config()
    w = make_weights(cfg, 3)
    _, fdir, _ = write_pair(tmp_path, cfg, w, is_linear)
    sdir, _, _ = write_pair(tmp_path, cfg, w, is_linear, swap=True, tag="swap")
    err = rel_err(logits(kaon_bin, sdir, IDS, tmp_path), logits(kaon_bin, fdir, IDS, tmp_path))
    print(f"swapped nibbles: relative logit error {err:.2e}")
    assert err > 1000 * BOUND


def test_mxfp4_info(kaon_bin, tmp_path):
    cfg = dense_config()
    qdir, _, _ = write_pair(tmp_path, cfg, make_weights(cfg, 1), is_linear)
    r = kaon_info(kaon_bin, qdir)
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    assert "mxfp4, blocks of 32" in r.stdout
    line = next(l for l in r.stdout.splitlines() if "q_proj" in l)
    assert "MXFP4" in line


def test_mxfp4_not_convert_and_bad_tensors(kaon_bin, tmp_path):
    cfg = dense_config()
    w = make_weights(cfg, 2)
    # Left float by modules_to_not_convert (as gpt-oss leaves attention): loads and matches.
    attn = lambda n: "self_attn" in n
    qdir, fdir, _ = write_pair(tmp_path, cfg, w, lambda n: is_linear(n) and not attn(n),
                               NOT_CONVERT + ["model.layers.*.self_attn"])
    assert rel_err(logits(kaon_bin, qdir, IDS, tmp_path), logits(kaon_bin, fdir, IDS, tmp_path)) < BOUND
    # Stored as MXFP4 but listed there: refused.
    bad, _, _ = write_pair(tmp_path, cfg, w, is_linear, NOT_CONVERT + ["model.layers.*.self_attn"], tag="bad")
    r = kaon_info(kaon_bin, bad)
    assert r.returncode != 0 and "self_attn.q_proj' is stored as MXFP4" in r.stderr, r.stderr
    qc, files, _ = quantize_checkpoint(w, is_linear, NOT_CONVERT)
    name = "model.layers.0.self_attn.o_proj.weight"
    cases = [({name + "_scales": None}, f"'{name}_blocks' has no '{name}_scales'"),
             ({name + "_scales": ("U8", np.zeros((160, 4), np.uint8))}, "_scales U8"),
             ({name + "_blocks": ("F32", np.zeros((160, 5, 16), np.float32))}, "_blocks must be U8")]
    for i, (change, words) in enumerate(cases):
        t = {k: v for k, v in dict(files, **change).items() if v is not None}
        r = kaon_info(kaon_bin, write_folder(tmp_path / f"bad{i}", dict(cfg, quantization_config=qc), t, "F32"))
        assert r.returncode != 0 and words in r.stderr, r.stderr


@pytest.mark.parametrize("fused", [True, False])
def test_mxfp4_moe_experts(kaon_bin, tmp_path, fused):
    # gpt-oss's split: only the experts are MXFP4 (stacked [E, rows, cols] when fused, else one
    # Linear per expert); attention and the router stay float by modules_to_not_convert.
    from moe_models import RefMoeModel, fuse_experts, make_moe_config, make_moe_weights
    cfg = make_moe_config("qwen3moe")
    for seed in range(10):  # the first model whose routing has no near-ties (f32 picks the same experts)
        w = make_moe_weights(cfg, seed)
        _, _, deq = quantize_checkpoint(w, lambda n: ".experts." in n)
        ref_model = RefMoeModel(cfg, deq)
        ref_model.forward(IDS)
        if ref_model.min_margin > 1e-4:
            break
    assert ref_model.min_margin > 1e-4, ref_model.min_margin
    if fused:
        w = fuse_experts(cfg, w)
    nc = NOT_CONVERT + ["model.layers.*.self_attn", "model.layers.*.mlp.gate"]
    qdir, fdir, files = write_pair(tmp_path, cfg, w, lambda n: ".experts." in n, nc)
    assert any(k.endswith("experts.gate_up_proj_blocks" if fused else "experts.3.up_proj.weight_blocks") for k in files)
    for mode in ("prefill", "decode"):
        ours, want = logits(kaon_bin, qdir, IDS, tmp_path, mode), logits(kaon_bin, fdir, IDS, tmp_path, mode)
        err = rel_err(ours, want)
        print(f"qwen3moe fused={fused} {mode}: relative logit error {err:.2e} vs kaon F32")
        assert err < BOUND
        assert (ours.argmax(-1) == want.argmax(-1)).all()
