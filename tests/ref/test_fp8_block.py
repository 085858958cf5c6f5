"""FP8 block-quantized checkpoints (DeepSeek-V3's layout) on the CPU: kaon's logits equal a
float numpy forward of the same model with the dequantized weights (activations stay float, so
only f32 rounding separates them); the ignore list, missing scales and unsupported methods are
clear errors."""
import json
import subprocess

import numpy as np
import pytest

from bf16 import round_bf16
from fp8_files import E4M3, ActQuantWeight, quantize_checkpoint, to_e4m3
from hf_files import write_folder
from kaon_cli import greedy, logits
from refmodel import RefModel
from tiny_models import make_config, make_weights

IDS = [1, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5]
FP8_QC = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
          "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}


def fp8_config():
    # Dimensions past one block and not multiples of 128: partial edge blocks in both directions.
    cfg = make_config("llama")
    cfg.update(hidden_size=160, intermediate_size=288, num_attention_heads=4, num_key_value_heads=2)
    return dict(cfg, torch_dtype="bfloat16", quantization_config=FP8_QC)


def fp8_model(folder, cfg, seed=3, skip=lambda n: n == "lm_head.weight"):
    w = round_bf16(make_weights(cfg, seed))  # norms, embedding and head stay bf16
    files, deq = quantize_checkpoint(w, skip)
    write_folder(folder, cfg, files, "BF16", indent=None)
    return folder, deq


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_e4m3_codes():
    # Every finite code round-trips, and the largest is 448.
    finite = np.arange(256)[~np.isnan(E4M3)]
    assert (to_e4m3(E4M3[finite]) == finite).sum() == len(finite) - 1  # -0 reads back as +0's twin
    assert E4M3[0x7E] == 448.0 and E4M3[0x01] == 2.0 ** -9


def test_fp8_block_logits(kaon_bin, tmp_path):
    cfg = fp8_config()
    model, deq = fp8_model(tmp_path / "fp8", cfg)
    ref = RefModel(cfg, deq, dtype=np.float64).forward(IDS)
    for mode in ("prefill", "decode"):
        ours = logits(kaon_bin, model, IDS, tmp_path, mode)
        err = rel_err(ours, ref)
        print(f"fp8 block {mode}: relative logit error {err:.2e}")
        assert err < 1e-5
        assert (ours.argmax(-1) == ref.argmax(-1)).all()
    # Greedy ids: the reference's continuation.
    got = greedy(kaon_bin, model, IDS, 6)
    r = RefModel(cfg, deq, dtype=np.float64)
    out, nxt = [], int(r.forward(IDS)[-1].argmax())
    for _ in range(6):
        out.append(nxt)
        nxt = int(r.forward([nxt])[-1].argmax())
    assert got == out


def kaon_fails(kaon_bin, model, *words):
    r = subprocess.run([str(kaon_bin), "info", str(model)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stdout
    for w in words:
        assert w in r.stderr, r.stderr
    return r.stderr


def test_fp8_info_bytes(kaon_bin, tmp_path):
    cfg = fp8_config()
    model, _ = fp8_model(tmp_path / "fp8", cfg)
    r = subprocess.run([str(kaon_bin), "info", str(model)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    assert "quantization:   fp8 (fp8 e4m3, blocks of 128x128, dynamic activations), from config.json" in r.stdout
    # Parameters: the FP8 matrices plus the bf16 embedding, head and norms; the scales are
    # bytes, not parameters (7 F32 scale tensors per layer).
    fp8 = 2 * (160 * 160 * 2 + 80 * 160 * 2 + 288 * 160 * 3)
    assert f"({fp8 + 2 * 300 * 160 + 5 * 160})" in r.stdout
    assert "FP8_E4M3 x14 (0.4 M params, 0.4 MiB)" in r.stdout and "F32 x14 (0.0 M params" in r.stdout
    line = next(l for l in r.stdout.splitlines() if "q_proj" in l)
    assert " x2 " in line and line.rstrip().endswith("F32 FP8_E4M3")


def test_fp8_ignored_module_quantized(kaon_bin, tmp_path):
    # lm_head is in modules_to_not_convert but stored FP8: refused, not run.
    cfg = fp8_config()
    model, _ = fp8_model(tmp_path / "bad", cfg, skip=lambda n: False)
    kaon_fails(kaon_bin, model, "lm_head.weight", "unquantized")


def test_fp8_missing_or_bad_scale(kaon_bin, tmp_path):
    cfg = fp8_config()
    w = round_bf16(make_weights(cfg, 1))
    files, _ = quantize_checkpoint(w, lambda n: n == "lm_head.weight")
    name = "model.layers.1.mlp.down_proj.weight_scale_inv"
    bad = dict(files)
    del bad[name]
    kaon_fails(kaon_bin, write_folder(tmp_path / "noscale", cfg, bad, "BF16"), "has no scale tensor", name)
    bad = dict(files, **{name: ("F32", np.ones((1, 1), np.float32))})
    kaon_fails(kaon_bin, write_folder(tmp_path / "shape", cfg, bad, "BF16"), name, "expected [2, 3]")
    # FP8 tensors without an fp8 quantization_config.
    emb, _ = quantize_checkpoint({"model.layers.0.mlp.up_proj.weight": w["model.embed_tokens.weight"]})
    bad = dict(files, **{"model.embed_tokens.weight": emb["model.layers.0.mlp.up_proj.weight"],
                         "model.embed_tokens.weight_scale_inv": emb["model.layers.0.mlp.up_proj.weight_scale_inv"]})
    kaon_fails(kaon_bin, write_folder(tmp_path / "emb", cfg, bad, "BF16"), "FP8 token embeddings are not supported")
    plain = {k: v for k, v in cfg.items() if k != "quantization_config"}
    kaon_fails(kaon_bin, write_folder(tmp_path / "noqc", plain, files, "BF16"), "no fp8 block quantization_config")


@pytest.mark.parametrize("qc,words", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemv"},
     ["quantization method 'awq' (4-bit int, group 128, zero points, gemv) is not supported yet",
      "supported: fp8 block (e4m3, weight_block_size)"]),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128, "desc_act": True, "sym": True},
     ["'gptq' (8-bit int, group 128, act-order)"]),
    ({"quant_method": "mystery-quant"}, ["'mystery-quant' (unknown format)"]),
    ({"quant_method": "fp8", "activation_scheme": "static"}, ["'fp8' (fp8 e4m3, per tensor, static activations)"]),
    ({"quant_method": "fp8", "weight_block_size": "128"}, ["quantization_config.weight_block_size"]),
])
def test_unsupported_quantization(kaon_bin, tmp_path, qc, words):
    cfg = dict(make_config("llama"), quantization_config=qc)
    model = write_folder(tmp_path / "q", cfg, make_weights(cfg, 0))
    kaon_fails(kaon_bin, model, *words)
    r = subprocess.run([str(kaon_bin), "run", "-m", str(model), "--prompt-ids", "1,2", "-n", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and words[0] in r.stderr


def test_fp8_block_deepseek_v3(kaon_bin, tmp_path):
    # A tiny DeepSeek-V3 with every layer dense (FP8 experts are not loaded yet): MLA's
    # projections in FP8, kv_b_proj dequantized at load into the absorbed per-head matrices.
    from deepseek_models import config_json, make_config as ds_config, make_weights as ds_weights
    from deepseek_ref import DeepseekRef
    cfg = ds_config("v3")
    cfg.update(num_hidden_layers=2, first_k_dense_replace=2, num_nextn_predict_layers=0)
    w = round_bf16(ds_weights(cfg, seed=5))
    files, deq = quantize_checkpoint(w, lambda n: n == "lm_head.weight")
    assert any(v[0] == "F8_E4M3" for v in files.values() if isinstance(v, tuple))
    conf = dict(config_json(cfg, "hub", "bfloat16"), quantization_config=dict(FP8_QC, modules_to_not_convert=None))
    model = write_folder(tmp_path / "ds", conf, files, "BF16", indent=None)
    ids = IDS * 3
    ref = DeepseekRef(cfg, deq).forward(ids)
    for mode in ("prefill", "decode"):
        ours = logits(kaon_bin, model, ids, tmp_path, mode)
        err = rel_err(ours, ref)
        print(f"deepseek-v3 fp8 block {mode}: relative logit error {err:.2e}")
        assert err < 1e-5
        assert (ours.argmax(-1) == ref.argmax(-1)).all()


def test_fp8_block_act_quant(kaon_bin, tmp_path, monkeypatch):
    # KAON_FP8_ACT=1: activations quantized per token in groups of 128 as DeepSeek's reference
    # does (the partial last group of 160 columns included), against the same in numpy.
    cfg = fp8_config()
    model, deq = fp8_model(tmp_path / "fp8", cfg)
    ref = RefModel(cfg, deq, dtype=np.float64)
    for k in deq:
        if k.startswith("model.layers."):
            if ref.w[k].ndim == 2:
                ref.w[k] = ref.w[k].view(ActQuantWeight)
    want = ref.forward(IDS)
    plain = RefModel(cfg, deq, dtype=np.float64).forward(IDS)
    monkeypatch.setenv("KAON_FP8_ACT", "1")
    ours = logits(kaon_bin, model, IDS, tmp_path)
    err, moved = rel_err(ours, want), rel_err(plain, want)
    print(f"fp8 block, quantized activations: relative logit error {err:.2e} (the quantization moves them {moved:.2e})")
    assert err < 1e-5 < moved
    assert (ours.argmax(-1) == want.argmax(-1)).all()
