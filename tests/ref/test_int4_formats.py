"""4-bit weight-only checkpoints (AWQ gemm, GPTQ v1/v2 with and without act-order,
compressed-tensors pack-quantized sym/asym) on the CPU: kaon unpacks them at load into its one
INT4 layout, and its logits equal those of the same model written with the dequantized weights
in F32 (f32 rounding only). A wrong unpacking (AWQ's nibble order, one nibble off) moves them
far past that bound; the ignore list and bad tensors are clear errors."""
import json
import subprocess

import numpy as np
import pytest

from hf_files import write_folder
from int4_files import FORMATS, quantize_checkpoint
from kaon_cli import logits
from refmodel import RefModel
from tiny_models import make_config, make_weights

IDS = [1, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5]
BOUND = 1e-5


def int4_config():
    # Widths of whole groups of 32 (160, 288) but not of 64: GPTQ group 64 has a partial group.
    cfg = make_config("llama")
    cfg.update(hidden_size=160, intermediate_size=288, num_attention_heads=4, num_key_value_heads=2)
    return cfg


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def write_pair(tmp_path, fmt, seed=4, **kw):
    """(int4 folder, dequantized F32 folder, dequantized weights)."""
    cfg = int4_config()
    qc, files, deq = quantize_checkpoint(make_weights(cfg, seed), fmt, seed=seed, **kw)
    q = write_folder(tmp_path / fmt, dict(cfg, torch_dtype="float16", quantization_config=qc), files, "F32",
                     indent=None)
    f = write_folder(tmp_path / (fmt + "-f32"), dict(cfg, torch_dtype="float32"), deq, "F32", indent=None)
    return q, f, deq


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_int4_logits(kaon_bin, tmp_path, fmt):
    qdir, fdir, deq = write_pair(tmp_path, fmt)
    ref = RefModel(int4_config(), deq, dtype=np.float64).forward(IDS)
    for mode in ("prefill", "decode"):
        ours = logits(kaon_bin, qdir, IDS, tmp_path, mode)
        want = logits(kaon_bin, fdir, IDS, tmp_path, mode)
        err, err64 = rel_err(ours, want), rel_err(ours, ref)
        print(f"{fmt} {mode}: relative logit error {err:.2e} vs kaon F32, {err64:.2e} vs float64")
        assert err < BOUND and err64 < BOUND
        assert (ours.argmax(-1) == want.argmax(-1)).all()


def test_int4_wrong_unpacking_fails(kaon_bin, tmp_path):
    # The bound means something: AWQ words packed in plain order, or one weight one step off,
    # move the logits well past it.
    _, fdir, deq = write_pair(tmp_path, "awq")
    want = logits(kaon_bin, fdir, IDS, tmp_path)
    (tmp_path / "plain").mkdir()
    qdir, _, _ = write_pair(tmp_path / "plain", "awq", awq_order=list(range(8)))
    err = rel_err(logits(kaon_bin, qdir, IDS, tmp_path), want)
    print(f"awq packed in plain order: relative logit error {err:.2e}")
    assert err > 1000 * BOUND
    name = "model.layers.0.mlp.down_proj.weight"
    w = deq[name]
    g = w[0, :32]
    step = float(np.min(np.diff(np.unique(g))))  # this group's scale: adjacent levels
    bad = dict(deq, **{name: w.copy()})
    bad[name][0, 5] += step
    bdir = write_folder(tmp_path / "nibble", dict(int4_config(), torch_dtype="float32"), bad, "F32", indent=None)
    err = rel_err(logits(kaon_bin, bdir, IDS, tmp_path), want)
    print(f"one nibble off by one: relative logit error {err:.2e}")
    assert err > 10 * BOUND


def kaon_info(kaon_bin, model):
    return subprocess.run([str(kaon_bin), "info", str(model)], capture_output=True, text=True, timeout=60)


def test_int4_info(kaon_bin, tmp_path):
    qdir, _, _ = write_pair(tmp_path, "gptq_act_order")
    r = kaon_info(kaon_bin, qdir)
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    assert "4-bit int, group 32, zero points, act-order" in r.stdout
    line = next(l for l in r.stdout.splitlines() if "q_proj" in l)
    assert "I4" in line and "F32" in line and "I32" in line  # weights, scales and zeros, permutation


def test_int4_ignore_list(kaon_bin, tmp_path):
    # A module the ignore list names stays float (loads); stored as INT4, it is refused.
    cfg = int4_config()
    w = make_weights(cfg, 2)
    down1 = "model.layers.1.mlp.down_proj.weight"
    qc, files, deq = quantize_checkpoint(w, "ct_asym", skip=lambda n: n == down1)
    qc["ignore"].append("re:.*layers\\.1\\.mlp\\.down_proj")
    qdir = write_folder(tmp_path / "ok", dict(cfg, quantization_config=qc), files, "F32", indent=None)
    fdir = write_folder(tmp_path / "f32", cfg, deq, "F32", indent=None)
    assert rel_err(logits(kaon_bin, qdir, IDS, tmp_path), logits(kaon_bin, fdir, IDS, tmp_path)) < BOUND
    _, files, _ = quantize_checkpoint(w, "ct_asym")
    bad = write_folder(tmp_path / "bad", dict(cfg, quantization_config=qc), files, "F32", indent=None)
    r = kaon_info(kaon_bin, bad)
    assert r.returncode != 0 and "model.layers.1.mlp.down_proj' is stored as INT4" in r.stderr, r.stderr


def test_int4_bad_tensors(kaon_bin, tmp_path):
    cfg = int4_config()
    qc, files, _ = quantize_checkpoint(make_weights(cfg, 1), "gptq_act_order")
    name = "model.layers.0.self_attn.o_proj"
    cases = [
        ({f"{name}.scales": ("F16", np.ones((2, 160), np.float16))}, "expected [5, 160]"),
        ({f"{name}.qzeros": None}, f"has no tensor '{name}.qzeros'"),
        ({f"{name}.g_idx": ("I32", np.zeros(160, np.int32))}, "does not give every group 32 columns"),
        ({f"{name}.qweight": ("F32", np.zeros((20, 160), np.float32))}, "expected I32"),
    ]
    for i, (change, words) in enumerate(cases):
        bad = {k: v for k, v in dict(files, **change).items() if v is not None}
        r = kaon_info(kaon_bin, write_folder(tmp_path / f"bad{i}", dict(cfg, quantization_config=qc), bad, "F32"))
        assert r.returncode != 0 and words in r.stderr, r.stderr


@pytest.mark.parametrize("arch,fmt", [("qwen2moe", "gptq_act_order"), ("qwen3moe", "awq"), ("mixtral", "ct_asym")])
def test_int4_moe_experts(kaon_bin, tmp_path, arch, fmt):
    # Routed experts (and Qwen2-MoE's shared expert) in INT4 go through the same CPU linear;
    # routers stay float as the producers leave them.
    from moe_models import RefMoeModel, make_moe_config, make_moe_weights
    cfg = make_moe_config(arch)
    router = lambda n: n.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight", "shared_expert_gate.weight"))
    for seed in range(10):  # the first model whose routing has no near-ties (f32 picks the same experts)
        qc, files, deq = quantize_checkpoint(make_moe_weights(cfg, seed), fmt, seed=seed, skip=router)
        ref_model = RefMoeModel(cfg, deq)
        ref = ref_model.forward(IDS)
        if ref_model.min_margin > 1e-4:
            break
    assert ref_model.min_margin > 1e-4, ref_model.min_margin
    assert any(".experts.1." in k and k.endswith(("qweight", "weight_packed")) for k in files)
    qdir = write_folder(tmp_path / "q", dict(cfg, quantization_config=qc), files, "F32", indent=None)
    fdir = write_folder(tmp_path / "f", cfg, deq, "F32", indent=None)
    for mode in ("prefill", "decode"):
        ours, want = logits(kaon_bin, qdir, IDS, tmp_path, mode), logits(kaon_bin, fdir, IDS, tmp_path, mode)
        err, err64 = rel_err(ours, want), rel_err(ours, ref)
        print(f"{arch} {fmt} {mode}: relative logit error {err:.2e} vs kaon F32, {err64:.2e} vs float64")
        assert err < BOUND and err64 < 1e-4
        assert (ours.argmax(-1) == want.argmax(-1)).all()


# ---- --load-format dummy ----------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["awq", "gptq_sym", "ct_asym"])
def test_dummy_int4(kaon_bin, tmp_path, fmt):
    # A 4-bit config without weights: INT4 placeholders (group from the config, zeros when
    # asymmetric; embedding and head bf16) filled on the host, run on the CPU.
    qc, gs, sym, _ = FORMATS[fmt]
    if qc is None:
        from int4_files import ct_config
        qc = ct_config(sym, gs)
    folder = tmp_path / fmt
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(int4_config(), quantization_config=qc)))
    r = subprocess.run([str(kaon_bin), "info", f"dummy:{folder}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    assert "I4" in r.stdout and "F32" in r.stdout and "BF16" in r.stdout
    a = logits(kaon_bin, f"dummy:{folder}", IDS, tmp_path)
    assert np.isfinite(a).all() and a.std() > 0
    b = logits(kaon_bin, f"dummy:{folder}", IDS, tmp_path, "decode")
    assert rel_err(b, a) < 1e-4  # the same random weights each run (seeded)
