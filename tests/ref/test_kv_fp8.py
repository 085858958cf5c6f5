"""--kv-cache-dtype fp8: the KV cache holds e4m3 codes of x / scale (one byte each). kaon's
logits with it against the numpy reference model whose K and V go through the same e4m3 round
trip; greedy generation against the default cache; the pool's token capacity; bad values."""
import json
import os
import re
import subprocess

import numpy as np
import pytest

import deepseek_models
from deepseek_ref import DeepseekRef
from refmodel import RefModel
from tiny_models import make_config, make_weights, save_hf

IDS = [1, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13, 8, 150, 77, 31]


def e4m3(x):
    """x rounded to the nearest e4m3fn value (ties to even), saturated at +-448."""
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    _, ex = np.frexp(a)  # a = m 2^ex, m in [0.5, 1)
    step = np.exp2(np.maximum(ex - 1, -6) - 3.0)  # 3 mantissa bits; subnormals below 2^-6
    q = np.minimum(np.round(a / step) * step, 448.0)  # np.round: half to even
    return np.sign(x) * q


def test_e4m3_reference_values():
    # Fixed points of the format and the rounding between them (so the reference is checked too).
    assert e4m3([0.0, 1.0, 1.0625, 1.1875, 448.0, 500.0, -1000.0, 2.0**-9, 2.0**-10, 0.3]).tolist() == [
        0.0, 1.0, 1.0, 1.25, 448.0, 448.0, -448.0, 2.0**-9, 0.0, 0.3125]


def kaon(exe, *args, env=None):
    r = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, **(env or {})})
    return r


def logits(exe, model, tmp_path, *extra, ids=IDS):
    out = tmp_path / "logits.f32"
    r = kaon(exe, "logits", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-o", out, "--threads", 2, *extra)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    cfg = make_config("llama")
    w = make_weights(cfg, seed=3)
    return save_hf(tmp_path_factory.mktemp("kvfp8") / "llama", cfg, w, "F32"), cfg, w


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_logits_match_the_quantized_reference(kaon_bin, tiny_llama, tmp_path, mode):
    """kaon's fp8-cache logits sit much closer to the reference with e4m3 K/V than to the plain
    one: the cache really holds e4m3 codes, and decodes them as the reference does."""
    model, cfg, w = tiny_llama
    ref = RefModel(cfg, w).forward(IDS)
    rq = RefModel(cfg, w)
    rq.kv_quant = e4m3  # the checkpoint has no scales: 1.0
    ref_q = rq.forward(IDS)
    extra = ["--kv-cache-dtype", "fp8"] + (["--decode"] if mode == "decode" else [])
    ours = logits(kaon_bin, model, tmp_path, *extra)
    e_q, e_plain, quant_effect = rel_err(ours, ref_q), rel_err(ours, ref), rel_err(ref_q, ref)
    print(f"{mode}: vs e4m3 reference {e_q:.2e}, vs plain {e_plain:.2e}, e4m3's own effect {quant_effect:.2e}")
    assert quant_effect > 1e-3  # the test can tell the two apart
    assert e_q < 0.1 * quant_effect
    assert (ours.argmax(-1) == ref_q.argmax(-1)).mean() >= 0.9


def test_mla_logits_match_the_quantized_reference(kaon_bin, tmp_path):
    """DeepSeek-V3's latent cache rows [c | k_pe] in e4m3: kaon (absorbed MLA on the CPU; an fp8
    cache never runs the expanded form) against the float64 reference with the same round trip."""
    cfg = deepseek_models.make_config("v3")
    w = deepseek_models.make_weights(cfg, seed=5)
    model = deepseek_models.save_hf(tmp_path / "v3", cfg, w, "F32")
    ref = DeepseekRef(cfg, w, mla="absorbed").forward(IDS)
    rq = DeepseekRef(cfg, w, mla="absorbed")
    rq.kv_quant = e4m3
    ref_q = rq.forward(IDS)
    for extra in ([], ["--decode"], ["--chunk", "4"]):
        ours = logits(kaon_bin, model, tmp_path, "--kv-cache-dtype", "fp8", *extra)
        e_q, quant_effect = rel_err(ours, ref_q), rel_err(ref_q, ref)
        print(f"mla {extra}: vs e4m3 reference {e_q:.2e}, e4m3's own effect {quant_effect:.2e}")
        assert quant_effect > 1e-3
        assert e_q < 0.1 * quant_effect


def generate(exe, model, tmp_path, prompts, extra=(), env=None):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
    r = kaon(exe, "generate", "-m", model, "--input", inp, "--output", out, "--threads", 2, "--temp", 0,
             "--max-tokens", 16, "--ignore-eos", *extra, env=env)
    assert r.returncode == 0, r.stderr
    return [json.loads(l)["token_ids"] for l in out.read_text().splitlines()], r.stderr


@pytest.fixture(scope="module")
def tiny_deepseek(tmp_path_factory):
    cfg = deepseek_models.make_config("v3")
    return deepseek_models.save_hf(tmp_path_factory.mktemp("kvfp8") / "v3", cfg,
                                   deepseek_models.make_weights(cfg, seed=7), "F32")


@pytest.mark.parametrize("arch", ["llama", "deepseek-v3"])
def test_greedy_agrees_with_the_default_cache(kaon_bin, tiny_llama, tiny_deepseek, tmp_path, arch):
    """Batched greedy generation (16 prompts, 16 tokens) with the fp8 cache against the f32 one.
    Tiny random models have small logit margins, so the two may part; but only where they may:
    at the first differing token d of a sequence, the f32 logits' top-2 margin must be within
    twice the largest change the fp8 cache makes to any logit there (both teacher-forced on
    the same prefix through `kaon logits`). A wrong fp8 path parts where margins are wide."""
    model = tiny_llama[0] if arch == "llama" else tiny_deepseek
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 300, int(rng.integers(4, 40))).tolist() for _ in range(16)]
    base, _ = generate(kaon_bin, model, tmp_path, prompts)
    f8, _ = generate(kaon_bin, model, tmp_path, prompts, ["--kv-cache-dtype", "fp8_e4m3"])
    same, checked = 0, 0
    for p, a, b in zip(prompts, base, f8):
        if a == b:
            same += 1
            continue
        d = next(i for i in range(len(a)) if a[i] != b[i])
        seq = p + a[:d]
        l32 = logits(kaon_bin, model, tmp_path, ids=seq)[-1]
        l8 = logits(kaon_bin, model, tmp_path, "--kv-cache-dtype", "fp8", ids=seq)[-1]
        assert l32.argmax() == a[d] and l8.argmax() == b[d]  # the runs are what logits says
        top = np.sort(l32)[-2:]
        margin, change = float(top[1] - top[0]), float(np.abs(l8 - l32).max())
        spread = float(l32.max() - l32.min())
        print(f"  d={d} margin {margin:.3g} change {change:.3g} spread {spread:.3g}")
        assert margin <= 2 * change, (p, d, margin, change)
        if arch == "llama":  # (DeepSeek's tiny latent attention is far more sensitive: see the MLA test)
            assert change < 0.05 * spread, (p, d, change, spread)
        checked += 1
    print(f"{arch}: {same}/16 identical; {checked} part at near-ties")


def fits(stderr):
    m = re.search(r"(\d+) tokens fit \([\d.]+ MiB, (\d+) B/token (\w+)\)", stderr)
    assert m, stderr
    return int(m.group(1)), int(m.group(2)), m.group(3)


def test_capacity_in_the_same_memory(kaon_bin, tiny_llama, tmp_path):
    """The same --kv-cache-memory holds 4x the tokens of the CPU's f32 cache (2x bf16's)."""
    model = tiny_llama[0]
    args = (["--kv-cache-memory", 4],)
    env = {"KAON_LOG": "info"}
    _, e32 = generate(kaon_bin, model, tmp_path, [[1, 2, 3]], *args, env=env)
    _, e8 = generate(kaon_bin, model, tmp_path, [[1, 2, 3]], ["--kv-cache-memory", 4, "--kv-cache-dtype", "fp8"],
                     env=env)
    t32, b32, d32 = fits(e32)
    t8, b8, d8 = fits(e8)
    assert (d32, d8) == ("f32", "fp8_e4m3")
    assert b32 == 4 * b8
    assert t8 >= 4 * t32 - 16 and t8 <= 4 * t32 + 64  # whole blocks of 16 either way
    r = kaon(kaon_bin, "info", model)
    assert f"{b8} B/token in fp8_e4m3" in r.stdout, r.stdout


@pytest.mark.parametrize("cmd", ["run", "generate", "logits"])
def test_bad_value(kaon_bin, tiny_llama, tmp_path, cmd):
    model = tiny_llama[0]
    extra = {"run": ["--prompt-ids", "1,2"], "generate": ["--input", tmp_path / "none.jsonl"],
             "logits": ["--prompt-ids", "1,2", "-o", tmp_path / "x.f32"]}[cmd]
    r = kaon(kaon_bin, cmd, "-m", model, *extra, "--kv-cache-dtype", "fp16")
    assert r.returncode != 0
    assert "bad --kv-cache-dtype 'fp16' (auto, bf16, fp8 or fp8_e4m3)" in r.stderr, r.stderr


def test_bf16_and_auto_are_the_default(kaon_bin, tiny_llama, tmp_path):
    model = tiny_llama[0]
    a = logits(kaon_bin, model, tmp_path)
    assert np.array_equal(a, logits(kaon_bin, model, tmp_path, "--kv-cache-dtype", "bf16"))
    assert np.array_equal(a, logits(kaon_bin, model, tmp_path, "--kv-cache-dtype", "auto"))
