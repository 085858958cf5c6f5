"""INT8 checkpoints as llm-compressor writes them (compressed-tensors "int-quantized": I8 weights,
symmetric, one f32/bf16 weight_scale per output channel [out, 1] or per tensor [1]; activations
float, int8 per token (dynamic) or by a stored input_scale) on the CPU. Weight-only
(KAON_FP8_ACT=0) kaon's logits equal the float model of the dequantized weights; by default the
int8 activations are emulated in numpy with vLLM's scaled_int8_quant formulas (per token:
q = rn(x * 127 / amax); static: q = rn(x / input_scale); clamped to [-128, 127]) and kaon
must match that within f32 rounding, while the activation rounding itself moves the logits by
far more. A MoE (Qwen3-MoE shape) with INT8 experts too."""
import json
import subprocess

import numpy as np
import pytest

from bf16 import bf16_bits_to_f32, round_bf16, to_bf16_bits
from hf_files import write_folder
from kaon_cli import logits
from refmodel import RefModel
from test_fp8_block import fp8_config, rel_err
from test_fp8_formats import IDS, check, info  # the same two comparisons as the FP8 formats'
from tiny_models import make_weights

F32 = np.float32


def int8_config(strategy, act):
    """compressed-tensors int-quantized quantization_config (W8A8 / W8A16 as llm-compressor saves it)."""
    w = {"num_bits": 8, "type": "int", "strategy": strategy, "symmetric": True, "dynamic": False,
         "group_size": None, "observer": "minmax"}
    inp = None
    if act == "token":
        inp = {"num_bits": 8, "type": "int", "strategy": "token", "symmetric": True, "dynamic": True}
    elif act == "static":
        inp = {"num_bits": 8, "type": "int", "strategy": "tensor", "symmetric": True, "dynamic": False}
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": inp}},
            "ignore": ["lm_head"]}


def quantize_int8(w, strategy):
    """(int8 codes, stored scale, f32 dequantized weight) as llm-compressor's minmax observer."""
    w = np.asarray(w, F32)
    amax = np.abs(w).max(1, keepdims=True) if strategy == "channel" else np.abs(w).max().reshape(1, 1)
    s = (np.maximum(amax, 1e-12) / F32(127)).astype(F32)
    q = np.clip(np.rint(w / s), -128, 127).astype(np.int8)
    return q, s, (q.astype(F32) * s).astype(F32)


def int8_rn(v):
    return np.clip(np.rint(v), -128, 127)  # np.rint: to nearest, ties to even


def token_quant(x):
    x = np.asarray(x, F32)
    amax = np.abs(x).max(-1, keepdims=True).astype(F32)
    safe = np.where(amax > 0, amax, F32(1))
    q = int8_rn((x * (F32(127) / safe)).astype(F32))
    return np.where(amax > 0, q * (safe / F32(127)), 0).astype(F32)


def static_quant(x, s):
    x = np.asarray(x, F32)
    return (int8_rn((x / F32(s)).astype(F32)) * F32(s)).astype(F32)


class TokenQuant(np.ndarray):
    def __rmatmul__(self, other):
        return token_quant(other).astype(np.float64) @ np.asarray(self)


def static_weight(w, s):
    class StaticQuant(np.ndarray):
        def __rmatmul__(self, other):
            return static_quant(other, s).astype(np.float64) @ np.asarray(self)
    return w.view(StaticQuant)


def write_int8(folder, cfg, strategy, act, seed=3, scale_dtype="F32", edit=None):
    """A checkpoint of INT8 weights: (folder, dequantized weights, input scales by weight name)."""
    w = round_bf16(make_weights(cfg, seed))
    rng = np.random.default_rng(seed)
    files, deq, in_scales = {}, {}, {}
    for name, t in w.items():
        if t.ndim != 2 or "embed_tokens" in name or name == "lm_head.weight":
            files[name], deq[name] = t, t
            continue
        q, s, d = quantize_int8(t, strategy)
        m = name[:-len(".weight")]
        if scale_dtype == "BF16":
            s = bf16_bits_to_f32(to_bf16_bits(s)).astype(F32)
            d = (q.astype(F32) * s).astype(F32)
        files[name], deq[name] = ("I8", q), d
        files[m + ".weight_scale"] = s if strategy == "channel" else s.reshape(1)
        if act == "static":  # a different scale per module: a swapped one shows
            in_scales[name] = F32(rng.uniform(0.02, 0.05))
            files[m + ".input_scale"] = ("F32", np.array(in_scales[name], F32).reshape(1))
    if edit:
        edit(files)
    keep = () if scale_dtype == "BF16" else (".weight_scale",)
    write_folder(folder, cfg, files, "BF16", keep_f32=keep, indent=None)
    return folder, deq, in_scales


def test_int8_channel_dynamic_token(kaon_bin, tmp_path, monkeypatch):
    cfg = dict(fp8_config(), quantization_config=int8_config("channel", "token"))
    model, deq, _ = write_int8(tmp_path / "w8a8", cfg, "channel", "token")
    out = info(kaon_bin, model)
    assert "compressed-tensors (8-bit int, per channel, dynamic per-token activations)" in out, out
    check(kaon_bin, tmp_path, monkeypatch, cfg, model, deq, lambda k, w: w.view(TokenQuant))


def test_int8_tensor_static(kaon_bin, tmp_path, monkeypatch):
    cfg = dict(fp8_config(), quantization_config=int8_config("tensor", "static"))
    model, deq, scales = write_int8(tmp_path / "static", cfg, "tensor", "static", scale_dtype="BF16")
    assert "8-bit int, per tensor, static activations" in info(kaon_bin, model)
    check(kaon_bin, tmp_path, monkeypatch, cfg, model, deq, lambda k, w: static_weight(w, scales[k]))


def test_int8_weight_only(kaon_bin, tmp_path, monkeypatch):
    cfg = dict(fp8_config(), quantization_config=int8_config("channel", None))
    model, deq, _ = write_int8(tmp_path / "w8a16", cfg, "channel", None)
    check(kaon_bin, tmp_path, monkeypatch, cfg, model, deq, None)
    monkeypatch.delenv("KAON_FP8_ACT")  # weight-only by the format: the same without the switch
    plain = RefModel(cfg, deq, dtype=np.float64).forward(IDS)
    assert rel_err(logits(kaon_bin, model, IDS, tmp_path), plain) < 1e-5


def test_int8_moe_experts(kaon_bin, tmp_path, monkeypatch):
    # Qwen3-MoE with the experts and the attention in INT8 W8A8; the router stays float, as
    # llm-compressor's recipes leave mlp.gate.
    from moe_models import RefMoeModel, make_moe_config, make_moe_weights
    cfg = dict(make_moe_config("qwen3moe"), torch_dtype="bfloat16", quantization_config=int8_config("channel", "token"))
    for seed in range(10):  # the first model whose routing has no near-ties (f32 picks the same experts)
        w = round_bf16(make_moe_weights(cfg, seed))
        files, deq = {}, {}
        for name, t in w.items():
            if t.ndim != 2 or "embed_tokens" in name or name == "lm_head.weight" or name.endswith("mlp.gate.weight"):
                files[name], deq[name] = t, t
                continue
            q, sc, d = quantize_int8(t, "channel")
            files[name], deq[name] = ("I8", q), d
            files[name[:-len(".weight")] + ".weight_scale"] = sc
        ref = RefMoeModel(cfg, deq)
        for k in list(ref.w):
            if k in files and isinstance(files[k], tuple):
                ref.w[k] = ref.w[k].view(TokenQuant)
        want = ref.forward(IDS)
        if ref.min_margin > 1e-4:
            break
    assert ref.min_margin > 1e-4, ref.min_margin
    assert any(".experts.1.down_proj.weight" in k and isinstance(v, tuple) and v[0] == "I8" for k, v in files.items())
    model = write_folder(tmp_path / "moe", cfg, files, "BF16", keep_f32=(".weight_scale",), indent=None)
    plain = RefMoeModel(cfg, deq).forward(IDS)
    monkeypatch.setenv("KAON_FP8_ACT", "0")
    err = rel_err(logits(kaon_bin, model, IDS, tmp_path), plain)
    print(f"int8 moe, weight-only: {err:.2e}")
    assert err < 1e-5
    monkeypatch.delenv("KAON_FP8_ACT")
    ours = logits(kaon_bin, model, IDS, tmp_path)
    err, moved = rel_err(ours, want), rel_err(plain, want)
    print(f"int8 moe, int8 activations (seed {seed}): {err:.2e} (moves {moved:.2e})")
    assert err < 1e-5 < moved


@pytest.mark.parametrize("edit,words", [
    (lambda qc: qc["config_groups"]["group_0"]["weights"].update(symmetric=False), ["zero points"]),
    (lambda qc: qc["config_groups"]["group_0"]["weights"].update(strategy="group", group_size=128), ["group 128"]),
    (lambda qc: qc["config_groups"]["group_0"]["input_activations"].update(strategy="group"), ["per-group"]),
])
def test_int8_unsupported_variants(kaon_bin, tmp_path, edit, words):
    qc = int8_config("channel", "token")
    edit(qc)
    cfg = dict(fp8_config(), quantization_config=qc)
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run([str(kaon_bin), "info", str(folder)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not supported" in r.stderr and all(w in r.stderr for w in words), r.stderr


def test_int8_missing_scale(kaon_bin, tmp_path):
    cfg = dict(fp8_config(), quantization_config=int8_config("channel", "token"))
    drop = "model.layers.1.mlp.down_proj.weight_scale"
    model = write_int8(tmp_path / "w8a8", cfg, "channel", "token", edit=lambda files: files.pop(drop))[0]
    r = subprocess.run([str(kaon_bin), "info", str(model)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and f"has no scale tensor '{drop}'" in r.stderr, r.stderr


def test_int8_dummy(kaon_bin, tmp_path):
    folder = tmp_path / "dummy"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(fp8_config(), quantization_config=int8_config("channel", "token"))))
    out = info(kaon_bin, f"dummy:{folder}")
    assert "I8" in out and "F32" in out, out
    a = logits(kaon_bin, f"dummy:{folder}", IDS, tmp_path)
    assert np.isfinite(a).all() and a.std() > 0
    b = logits(kaon_bin, f"dummy:{folder}", IDS, tmp_path, "decode")
    assert rel_err(b, a) < 1e-4
