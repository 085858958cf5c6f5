"""FP8 layers on the CUDA backend (src/backend/cuda/cuda_fp8.cu), run on the GPU machine by
`tests/gpu/run_all.sh fp8`. The reference is kaon's CPU backend on the same codes, scales and
inputs (KAON_OP_DEVICE=cpu, KAON_FP8_ACT=1 so DeepSeek's activation groups are quantized as the
GPU quantizes them); the CPU path itself is checked against numpy and transformers in tests/ref.
(Measured on the H200: GPU vs CPU 1.7e-3 to 2.4e-3 for every mode and batch, the bf16 rounding
of the output.)
Both quantize the activations identically and form exact e4m3 products, so they differ by the
summation order and the GPU's bf16 output only; against the float64 product with unquantized
activations they differ by the activation quantization (a few percent), which a wrong scale
layout would exceed many times over. Model level: a tiny Llama with 128 x 128 block FP8
weights, CUDA logits (prefill, decode, chunked) against the CPU's. There the bf16 activations of
the GPU and the f32 ones of the CPU make the two quantize a few elements to neighbouring e4m3
values, and this random model amplifies that to about the size of the quantization's own effect
(measured: 5.9% against a 5.0% effect; the GPU's own prefill and decode differ by 4.9%), so the
bound is relative to that effect, with top-1 agreement."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_gpu import bf16, driver, kernel_names, out, record, rel, run_op

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ref"))

NS = [1, 3, 8, 17, 64, 65, 300]
CPU_ENV = {"KAON_OP_DEVICE": "cpu", "KAON_FP8_ACT": "1"}


def codes(rng, shape):
    c = rng.integers(0, 256, shape).astype(np.uint8)
    c[(c & 0x7F) == 0x7F] -= 1  # no NaN codes
    return c


def e4m3_values():
    from fp8_files import E4M3
    return E4M3


def scales(rng, out_, in_, sb0, sb1):
    sr, sc = -(-out_ // sb0), -(-in_ // sb1)
    return ((0.5 + rng.random((sr, sc))) / np.sqrt(in_) / 448.0).astype(np.float32)


def dequant(c, s, sb0, sb1):
    w = e4m3_values()[c].astype(np.float64)
    return w * np.repeat(np.repeat(s.astype(np.float64), sb0, 0), sb1, 1)[:c.shape[0], :c.shape[1]]


def both(tmp, op, params, arrays):
    """Runs op on the GPU (tmp/gpu) and the CPU (tmp/cpu); returns their stdout."""
    g = run_op(tmp / "gpu", op, params, arrays)
    c = run_op(tmp / "cpu", op, params, arrays, env=CPU_ENV)
    return g, c


# (name, sb0, sb1, act, act_scale): block weights with DeepSeek's groups, channel scales with
# per-token activations, a tensor scale with one dynamic scale, ModelOpt's static input scale, and
# a weight-only layer (no activation quantization).
MODES = [("block", 128, 128, 1, 0.0), ("channel_token", 1, None, 2, 0.0), ("tensor_tensor", None, None, 3, 0.0),
         ("tensor_static", None, None, 4, 0.05), ("block_weight_only", 128, 128, 0, 0.0)]


@pytest.mark.parametrize("mode,sb0,sb1,act,act_scale", MODES)
@pytest.mark.parametrize("rows,cols,has_bias", [(512, 1024, 1), (1000, 2048, 0), (4096, 4096, 0)])
def test_fp8_linear(tmp_path, mode, sb0, sb1, act, act_scale, rows, cols, has_bias):
    rng = np.random.default_rng()
    sb0, sb1 = sb0 or rows, sb1 or cols
    w, s = codes(rng, (rows, cols)), scales(rng, rows, cols, sb0, sb1)
    x = bf16(rng.standard_normal((max(NS), cols)) * 2)
    b = rng.standard_normal(rows).astype(np.float32)
    p = dict(out=rows, ns=",".join(map(str, NS)), sb0=sb0, sb1=sb1, act=act, act_scale=act_scale, has_bias=has_bias,
             **{"in": cols})
    both(tmp_path, "fp8linear", p, dict(w=w, s=s, x=x, b=b))
    W = dequant(w, s, sb0, sb1)
    errs = {}
    for n in NS:
        g = out(tmp_path / "gpu", f"out_{n}", (n, rows))
        c = out(tmp_path / "cpu", f"out_{n}", (n, rows))
        plain = x[:n].astype(np.float64) @ W.T + (b if has_bias else 0)
        errs[n] = (rel(g, c), rel(g, plain), rel(c, plain))
        assert errs[n][0] < 5e-3, (mode, n, errs[n])
        assert errs[n][1] < 6e-2, (mode, n, errs[n])
    record("fp8_linear", mode=mode, rows=rows, inp=cols, gpu_vs_cpu={n: e[0] for n, e in errs.items()},
           gpu_vs_unquantized_x={n: e[1] for n, e in errs.items()}, cpu_vs_unquantized_x={n: e[2] for n, e in errs.items()})


@pytest.mark.parametrize("mode,sb0,sb1,act,act_scale", [MODES[0], MODES[1]])
@pytest.mark.parametrize("rows,cols,has_bias", [(512, 1024, 1), (1000, 2048, 0)])
def test_fp8_linear_padded(tmp_path, mode, sb0, sb1, act, act_scale, rows, cols, has_bias):
    """Batches of more than 64 tokens that are not a multiple of 16 through the padded cuBLASLt
    product (KAON_FP8_PAD=force; by default it runs only where cuBLASLt has no algorithm for n):
    the same results as the CPU's reference, and the rows past n do not leak in."""
    rng = np.random.default_rng()
    sb0, sb1 = sb0 or rows, sb1 or cols
    ns = [65, 100, 300, 333]
    w, s = codes(rng, (rows, cols)), scales(rng, rows, cols, sb0, sb1)
    x = bf16(rng.standard_normal((max(ns), cols)) * 2)
    b = rng.standard_normal(rows).astype(np.float32)
    p = dict(out=rows, ns=",".join(map(str, ns)), sb0=sb0, sb1=sb1, act=act, act_scale=act_scale, has_bias=has_bias,
             **{"in": cols})
    run_op(tmp_path / "gpu", "fp8linear", p, dict(w=w, s=s, x=x, b=b), env={"KAON_FP8_PAD": "force", "KAON_LOG": "info"})
    run_op(tmp_path / "cpu", "fp8linear", p, dict(w=w, s=s, x=x, b=b), env=CPU_ENV)
    for n in ns:
        g = out(tmp_path / "gpu", f"out_{n}", (n, rows))
        c = out(tmp_path / "cpu", f"out_{n}", (n, rows))
        assert np.isfinite(g).all() and rel(g, c) < 5e-3, (mode, n, rel(g, c))


@pytest.mark.parametrize("mode,sb0,sb1,act,act_scale", [MODES[0], MODES[1]])
def test_fp8_linear_f32_logits(tmp_path, mode, sb0, sb1, act, act_scale):
    rng = np.random.default_rng()
    rows, cols, ns = 1000, 1024, [1, 5, 70]
    sb0, sb1 = sb0 or rows, sb1 or cols
    w, s = codes(rng, (rows, cols)), scales(rng, rows, cols, sb0, sb1)
    x = bf16(rng.standard_normal((max(ns), cols)))
    p = dict(out=rows, ns=",".join(map(str, ns)), sb0=sb0, sb1=sb1, act=act, act_scale=act_scale, f32out=1,
             **{"in": cols})
    both(tmp_path, "fp8linear", p, dict(w=w, s=s, x=x))
    for n in ns:
        g, c = out(tmp_path / "gpu", f"out_{n}", (n, rows)), out(tmp_path / "cpu", f"out_{n}", (n, rows))
        assert rel(g, c) < 1e-3, (mode, n, rel(g, c))


def silu_arrays(rng, x, rows, cols, sb0, sb1):
    """The fp8silu op's inputs: x and random gate / up codes and scales of [rows, cols]."""
    return dict(x=x, wg=codes(rng, (rows, cols)), wu=codes(rng, (rows, cols)),
                sg=scales(rng, rows, cols, sb0, sb1 or cols), su=scales(rng, rows, cols, sb0, sb1 or cols))


@pytest.mark.parametrize("mode,sb0,sb1,act,act_scale", [MODES[0], MODES[1]])
def test_fp8_linear_multi_and_silu(tmp_path, mode, sb0, sb1, act, act_scale):
    rng = np.random.default_rng()
    cols, rows3, ns = 1024, (512, 128, 128), [1, 5, 8, 32, 33, 64, 65]
    x = bf16(rng.standard_normal((max(ns), cols)))
    arrays, params = dict(x=x), dict(ns=",".join(map(str, ns)), act=act, act_scale=act_scale, **{"in": cols})
    for k, r in enumerate(rows3):
        b0, b1 = sb0 or r, sb1 or cols
        arrays[f"w{k}"], arrays[f"s{k}"] = codes(rng, (r, cols)), scales(rng, r, cols, b0, b1)
        params[f"out{k}"] = r
    params.update(sb0=sb0, sb1=sb1 or cols)
    g, _ = both(tmp_path / "multi", "fp8multi", params, arrays)
    rc = json.loads(g)
    assert rc == [0] * len(ns), rc  # one quantization of x for all three, at every batch
    for n in ns:
        for k, r in enumerate(rows3):
            e = rel(out(tmp_path / "multi/gpu", f"out{k}_{n}", (n, r)), out(tmp_path / "multi/cpu", f"out{k}_{n}", (n, r)))
            assert e < 5e-3, (n, k, e)
    rows = 768
    sarr = silu_arrays(rng, x, rows, cols, sb0, sb1)
    g, _ = both(tmp_path / "silu", "fp8silu", dict(params, out=rows), sarr)
    assert json.loads(g) == [0] * len(ns)  # fused GEMV up to 32 tokens, two products + SiLU above
    for n in ns:
        e = rel(out(tmp_path / "silu/gpu", f"out_{n}", (n, rows)), out(tmp_path / "silu/cpu", f"out_{n}", (n, rows)))
        assert e < 1e-2, (n, e)


@pytest.mark.parametrize("mode,sb0,sb1,act,act_scale", [MODES[0], MODES[1]])
def test_fp8_silu_padded(tmp_path, mode, sb0, sb1, act, act_scale):
    """Gate and up of more than 64 tokens, not a multiple of 16, through the padded cuBLASLt
    product written straight into the gate/up scratch (KAON_FP8_PAD=force): the CPU's results, and
    the padding rows of gate do not spill into up."""
    rng = np.random.default_rng()
    cols, rows, ns = 1024, 768, [65, 100, 333]
    arrays = silu_arrays(rng, bf16(rng.standard_normal((max(ns), cols))), rows, cols, sb0, sb1)
    params = dict(ns=",".join(map(str, ns)), act=act, act_scale=act_scale, out=rows, sb0=sb0, sb1=sb1 or cols,
                  **{"in": cols})
    g = run_op(tmp_path / "gpu", "fp8silu", params, arrays, env={"KAON_FP8_PAD": "force"})
    run_op(tmp_path / "cpu", "fp8silu", params, arrays, env=CPU_ENV)
    assert json.loads(g) == [0] * len(ns)
    for n in ns:
        gp, cp = out(tmp_path / "gpu", f"out_{n}", (n, rows)), out(tmp_path / "cpu", f"out_{n}", (n, rows))
        assert np.isfinite(gp).all() and rel(gp, cp) < 1e-2, (mode, n, rel(gp, cp))


def block_fp8_llama(tmp_path, seed):
    """A tiny 3-layer Llama whose matrices but the head are 128 x 128 block FP8 (DeepSeek's
    convert): (folder, config)."""
    from fp8_files import quantize_checkpoint
    from hf_files import write_folder
    from tiny_models import make_config, make_weights
    from bf16 import round_bf16

    cfg = make_config("llama")
    cfg.update(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
               num_hidden_layers=3, vocab_size=512)
    cfg = dict(cfg, torch_dtype="bfloat16",
               quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                    "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]})
    files, _ = quantize_checkpoint(round_bf16(make_weights(cfg, seed)), lambda n: n == "lm_head.weight")
    return write_folder(tmp_path / "fp8", cfg, files, "BF16", indent=None), cfg


def test_fp8_model_cuda_vs_cpu(tmp_path):
    folder, cfg = block_fp8_llama(tmp_path, 11)
    rng = np.random.default_rng(5)
    ids = rng.integers(0, cfg["vocab_size"], 40).tolist()
    V = cfg["vocab_size"]

    def run_env(dev, chunk, act):
        o = tmp_path / f"{dev}_{chunk}_{act}.f32"
        p = subprocess.run([driver(), "logits", str(folder), dev, str(chunk), ",".join(map(str, ids)), str(o)],
                           capture_output=True, text=True, timeout=600, env=dict(os.environ, KAON_FP8_ACT=act))
        assert p.returncode == 0, p.stderr
        return np.fromfile(o, np.float32).reshape(len(ids), V)

    def run(dev, chunk):
        return run_env(dev, chunk, "1")

    ref = run("cpu", len(ids))
    # How far the activation quantization moves this model's logits (CPU, weight-only vs W8A8). Two
    # correct W8A8 runs that round their inputs differently (bf16 on the GPU, f32 on the CPU) cross
    # e4m3 rounding boundaries at different elements, so they differ by a good part of it; a wrong
    # scale, layout or skipped quantization moves the logits by far more than it.
    e_q = rel(ref, run_env("cpu", len(ids), "0"))
    res = {"act_quant_effect_cpu": e_q}
    for mode, chunk in (("prefill", len(ids)), ("decode", 1), ("chunked7", 7)):
        k = run("cuda", chunk)
        srt = np.sort(ref, -1)
        sel = srt[:, -1] - srt[:, -2] > 0.1
        top1 = float((k.argmax(-1) == ref.argmax(-1))[sel].mean()) if sel.any() else 1.0
        res[mode] = dict(rel_err=rel(k, ref), top1=top1, positions=int(sel.sum()))
        if mode == "prefill":
            pre = k
        else:
            res[mode]["vs_cuda_prefill"] = rel(k, pre)
    record("fp8_model", **res)
    print(json.dumps(res))
    for mode in ("prefill", "decode", "chunked7"):
        r = res[mode]
        assert r["rel_err"] <= 1.5 * e_q and r["top1"] >= 0.99, (mode, r, e_q)
        assert mode == "prefill" or r["vs_cuda_prefill"] <= 1.5 * e_q, (mode, r)


def test_fp8_norm_split_vs_cpu(tmp_path):
    """Batch-1 decode of a block-FP8 Llama with the RMSNorm split around the GEMVs (the default:
    o_proj / down add into the residual stream and leave x * w and its sums of squares, the
    activation quantization of qkv and gate/up applies 1 / rms) against the CPU's logits, as close
    as the separate kernels (KAON_NORM_SPLIT=0); the residual GEMV ran, and not with it off."""
    # test_fp8_model_cuda_vs_cpu's model and ids: fixed, since a random draw can put an FP8
    # near-tie (quantization moves these logits by ~5%) among the positions top-1 counts.
    folder, cfg = block_fp8_llama(tmp_path, 11)
    ids = np.random.default_rng(5).integers(0, cfg["vocab_size"], 40).tolist()
    V = cfg["vocab_size"]

    def logits(dev, chunk, env):
        o = tmp_path / f"{dev}.f32"
        p = subprocess.run([driver(), "logits", str(folder), dev, str(chunk), ",".join(map(str, ids)), str(o)],
                           capture_output=True, text=True, timeout=600, env=dict(os.environ, **{"KAON_FP8_ACT": "1", **env}))
        assert p.returncode == 0, p.stderr
        return np.fromfile(o, np.float32).reshape(len(ids), V)

    ref = logits("cpu", len(ids), {})
    e_q = rel(ref, logits("cpu", len(ids), {"KAON_FP8_ACT": "0"}))  # the activation quantization's effect
    split, ks = kernel_names(tmp_path, lambda env: logits("cuda", 1, dict(env, KAON_NORM_SPLIT_QUANT="1")))
    plain, kp = kernel_names(tmp_path, lambda env: logits("cuda", 1, dict(env, KAON_NORM_SPLIT="0")))
    res_kernel = re.compile(r"void k_fp8_gemv<1, 0, false, true[,>]")  # <NT, MODE, SILU, RES>
    assert any(res_kernel.match(k) for k in ks), sorted(ks)
    assert not any(res_kernel.match(k) for k in kp), sorted(kp)
    srt = np.sort(ref, -1)
    sel = srt[:, -1] - srt[:, -2] > 0.1
    top1 = float((split.argmax(-1) == ref.argmax(-1))[sel].mean()) if sel.any() else 1.0
    r = dict(rel_err=rel(split, ref), rel_err_plain=rel(plain, ref), split_vs_plain=rel(split, plain), top1=top1,
             act_quant_effect_cpu=e_q)
    record("fp8_norm_split", **r)
    print(json.dumps(r))
    assert r["rel_err"] <= 1.5 * e_q and top1 >= 0.99, r
    assert r["rel_err"] <= 1.5 * r["rel_err_plain"] + 1e-3, r


def test_fp8_deepseek_v3_moe_cuda_vs_cpu(tmp_path):
    """A small DeepSeek-V3 whose every matrix but the head is 128 x 128 block FP8 (MLA, dense MLP,
    the routed experts and the shared expert, as DeepSeek's checkpoints): CUDA logits (prefill,
    decode, chunked) against the CPU's. The GPU reads the experts weight-only and quantizes the
    other layers' activations; the CPU here quantizes every activation (KAON_FP8_ACT=1), so the
    bound is relative to the activation quantization's own effect, as in the dense test above."""
    from deepseek_models import config_json, make_config as ds_config, make_weights as ds_weights
    from fp8_files import quantize_checkpoint
    from hf_files import write_folder
    from bf16 import round_bf16

    cfg = ds_config("v3")
    # Widths the device FP8 kernels take (experts of 128-row multiples, inputs of 128-column multiples
    # for the activation groups),
    # 3 MoE layers after a dense one.
    cfg.update(hidden_size=256, intermediate_size=384, moe_intermediate_size=128, n_routed_experts=32, q_lora_rank=128,
               v_head_dim=32,
               num_experts_per_tok=8, n_group=4, topk_group=2, num_hidden_layers=4, first_k_dense_replace=1,
               vocab_size=512, num_nextn_predict_layers=0)
    w = round_bf16(ds_weights(cfg, seed=7))
    files, _ = quantize_checkpoint(w, lambda n: n == "lm_head.weight" or n.endswith("mlp.gate.weight"))
    qc = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
    folder = write_folder(tmp_path / "ds", dict(config_json(cfg, "hub", "bfloat16"), quantization_config=qc), files,
                          "BF16", indent=None)
    ids = np.random.default_rng(9).integers(0, cfg["vocab_size"], 48).tolist()
    V = cfg["vocab_size"]

    def run(dev, chunk, act="1"):
        o = tmp_path / f"{dev}_{chunk}_{act}.f32"
        p = subprocess.run([driver(), "logits", str(folder), dev, str(chunk), ",".join(map(str, ids)), str(o)],
                           capture_output=True, text=True, timeout=600, env=dict(os.environ, KAON_FP8_ACT=act))
        assert p.returncode == 0, p.stderr
        return np.fromfile(o, np.float32).reshape(len(ids), V)

    ref = run("cpu", len(ids))
    srt = np.sort(ref, -1)
    sel = srt[:, -1] - srt[:, -2] > 0.1

    def top1(k):
        return float((k.argmax(-1) == ref.argmax(-1))[sel].mean()) if sel.any() else 1.0

    # This random model's sigmoid routing turns the activation quantization into other experts: the
    # CPU's own weight-only run differs from its W8A8 one by ~19% (measured), top-1 ~80%. The GPU
    # (W8A8 attention and dense MLP, weight-only experts) sits between the two; a wrong scale or
    # layout gives errors of order 1 and chance-level top-1.
    wo = run("cpu", len(ids), "0")
    e_q, t_q = rel(ref, wo), top1(wo)
    res = {"act_quant_effect_cpu": e_q, "act_quant_top1_cpu": t_q}
    for mode, chunk in (("prefill", len(ids)), ("decode", 1), ("chunked7", 7)):
        k = run("cuda", chunk)
        res[mode] = dict(rel_err=rel(k, ref), top1=top1(k), positions=int(sel.sum()), vs_cpu_weight_only=rel(k, wo))
    record("fp8_deepseek_v3_moe", **res)
    print(json.dumps(res))
    for mode in ("prefill", "decode", "chunked7"):
        r = res[mode]
        assert r["rel_err"] <= 1.5 * e_q and r["top1"] >= t_q - 0.1, (mode, r, e_q, t_q)
