"""The CPU backend's linear and embed for every weight format, against the PyPI `gguf`
package's dequantizers and numpy.

Python writes a GGUF file (gguf.GGUFWriter) with random weights in each format (quantized by
gguf.quants.quantize where the package can: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; the K-quants and
IQ4_NL / IQ4_XS, which it cannot quantize, as random valid blocks with sane f16 scales) and
random f32 activations. `test_cpu_linear --ref` runs kaon's linear (n = 1, 3, 8, 33 rows) and
embed (every row) on them with each kernel set this CPU has; the results are compared with
numpy on gguf.quants.dequantize(W).

Error bound of linear: kaon quantizes each block of 32 activations to int8 with scale
d = max|x| / 127 and round-to-nearest, so every x moves by at most d / 2 = max|x| / 254; the
output therefore moves by at most sum over blocks of (max|x_block| / 254) * sum |w_block|.
That bound is rigorous; float32 accumulation adds at most ~1e-5 * sum |w x| on top. Float
weights (F32/F16/BF16) are not quantized, so only the float term applies. Embed (the
dequantization) must equal gguf's bit for bit: kaon's dequantizer (backend/quant_blocks.h)
rounds the same float32 operations in the same order.
"""
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from quant_blocks import RANDOM_BLOCK_SCALES, random_blocks

REPO = Path(__file__).resolve().parents[2]

# (name, type, rows, K): K covers whole groups of 8 blocks, a tail of 2, an odd block count.
CASES = [
    ("f32", QT.F32, 37, 320),
    ("f16", QT.F16, 37, 320),
    ("bf16", QT.BF16, 37, 320),
    ("q4_0", QT.Q4_0, 37, 320),
    ("q4_0_k96", QT.Q4_0, 29, 96),
    ("q4_1", QT.Q4_1, 37, 576),
    ("q4_1_k96", QT.Q4_1, 29, 96),
    ("q8_0", QT.Q8_0, 37, 320),
    ("q8_0_k96", QT.Q8_0, 29, 96),
    ("q4_k", QT.Q4_K, 37, 512),
    ("q6_k", QT.Q6_K, 37, 512),
    # (after the first formats, so theirs keep the random draws they always had)
    ("q5_0", QT.Q5_0, 37, 320),
    ("q5_0_k96", QT.Q5_0, 29, 96),
    ("q5_1", QT.Q5_1, 37, 576),
    ("q5_1_k96", QT.Q5_1, 29, 96),
    ("iq4_nl", QT.IQ4_NL, 37, 320),
    ("iq4_nl_k96", QT.IQ4_NL, 29, 96),
    ("q2_k", QT.Q2_K, 37, 512),
    ("q3_k", QT.Q3_K, 37, 512),
    ("q5_k", QT.Q5_K, 37, 768),
    ("iq4_xs", QT.IQ4_XS, 37, 512),
]
N_ROWS = 33


def helper():
    build = Path(os.environ.get("KAON_BUILD", REPO / "build"))
    exe = build / "tests" / "test_cpu_linear"
    if not exe.exists():
        pytest.fail(f"{exe} not found: build kaon first (or set KAON_BUILD to the build dir)")
    return exe


def make_weight(qt, rows, K, rng):
    """Returns (the bytes or array to store, the values gguf dequantizes them to)."""
    w = (rng.standard_normal((rows, K)) * 0.1).astype(np.float32)
    if qt == QT.F32:
        return w, w.astype(np.float64)
    if qt == QT.F16:
        h = w.astype(np.float16)
        return h, h.astype(np.float64)
    if qt in RANDOM_BLOCK_SCALES:
        raw = random_blocks(qt, rows, K, rng)
    else:
        raw = quantize(w, qt)
    return raw, dequantize(raw, qt).astype(np.float64).reshape(rows, K)


def activations(rng, n, K):
    x = rng.standard_normal((n, K)).astype(np.float32)
    spikes = rng.random((n, K)) < 0.02
    x[spikes] *= 12.0  # a few large values so block scales vary
    return x


@pytest.fixture(scope="module")
def ref_file(tmp_path_factory):
    rng = np.random.default_rng(1234)
    path = tmp_path_factory.mktemp("cpuq") / "weights.gguf"
    wr = gguf.GGUFWriter(str(path), "kaon-test")
    expect = {}
    for name, qt, rows, K in CASES:
        stored, values = make_weight(qt, rows, K, rng)
        x = activations(rng, N_ROWS, K)
        if qt in (QT.F32, QT.F16):
            wr.add_tensor(f"w.{name}", stored)
        else:
            wr.add_tensor(f"w.{name}", stored, raw_dtype=qt)
        wr.add_tensor(f"x.{name}", x)
        expect[name] = (qt, values, x)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path, expect


def run_helper(path, out, env_extra):
    env = dict(os.environ)
    env.pop("KAON_CPU_NO_SIMD", None)
    env.pop("KAON_CPU_NO_AVX512", None)
    env.update(env_extra)
    r = subprocess.run([str(helper()), "--ref", str(path), str(out)], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, f"test_cpu_linear --ref failed: {r.stderr}"
    kernels = r.stderr.split("kernels:")[-1].strip().split()[0]
    recs = []
    data = out.read_bytes()
    off = 0
    while off < len(data):
        tag = data[off:off + 4].decode()
        nl = int.from_bytes(data[off + 4:off + 8], "little")
        name = data[off + 8:off + 8 + nl].decode()
        off += 8 + nl
        rows, cols = np.frombuffer(data, dtype=np.int32, count=2, offset=off)
        off += 8
        vals = np.frombuffer(data, dtype=np.float32, count=rows * cols, offset=off)
        off += 4 * rows * cols
        recs.append((tag, name[2:], vals.reshape(rows, cols)))
    return kernels, recs


KERNEL_ENVS = [{}, {"KAON_CPU_NO_AVX512": "1"}, {"KAON_CPU_NO_SIMD": "1"}]


@pytest.mark.parametrize("env", KERNEL_ENVS, ids=["best", "no-avx512", "scalar"])
def test_linear_and_embed_match_gguf(ref_file, tmp_path, env):
    path, expect = ref_file
    kernels, recs = run_helper(path, tmp_path / "out.bin", env)
    if env.get("KAON_CPU_NO_SIMD"):
        assert kernels == "scalar"
    seen_lin, seen_emb = set(), set()
    for tag, name, got in recs:
        qt, W, x = expect[name]
        if tag == "EMB ":
            seen_emb.add(name)
            np.testing.assert_array_equal(got, W.astype(np.float32), err_msg=f"embed {name} [{kernels}]")
            continue
        assert tag == "LIN ", tag
        n = got.shape[0]
        seen_lin.add((name, n))
        xs = x[:n].astype(np.float64)
        ref = xs @ W.T
        mag = np.abs(xs) @ np.abs(W).T
        if qt in (QT.F32, QT.F16, QT.BF16):
            bound = 1e-5 * mag + 1e-6
        else:
            K = xs.shape[1]
            amax = np.abs(xs).reshape(n, K // 32, 32).max(axis=2)            # [n, nb]
            wabs = np.abs(W).reshape(W.shape[0], K // 32, 32).sum(axis=2)    # [M, nb]
            bound = (amax / 254.0) @ wabs.T * 1.0001 + 1e-5 * mag + 1e-6
        err = np.abs(got - ref)
        worst = float((err / bound).max())
        assert worst <= 1.0, f"linear {name} n={n} [{kernels}]: error {worst:.3f}x the bound"
        # The bound is a worst case. Rounding errors are uniform in +-d/2 (variance d^2/12) and
        # independent, so the typical error is sigma = sqrt(sum_b d_b^2 / 12 * sum w_b^2); a
        # kernel that dropped a block or a scale term would show here even under the bound.
        if qt in (QT.F32, QT.F16, QT.BF16):
            rel = float(np.sqrt(np.mean(err ** 2)) / np.sqrt(np.mean(ref ** 2)))
            assert rel < 2e-6, f"linear {name} n={n} [{kernels}]: relative RMS error {rel:.2e}"
        else:
            w2 = (W ** 2).reshape(W.shape[0], K // 32, 32).sum(axis=2)       # [M, nb]
            sigma = np.sqrt(((amax / 127.0) ** 2 / 12.0) @ w2.T)
            rel = float(np.sqrt(np.mean((err / sigma) ** 2)))
            assert 0.5 < rel < 1.5, f"linear {name} n={n} [{kernels}]: error RMS {rel:.2f} sigma"
        if os.environ.get("KAON_TEST_VERBOSE"):
            print(f"{kernels} {name} n={n}: worst {worst:.3f} of the bound, RMS {rel:.3g}")
    assert seen_emb == set(expect)
    assert seen_lin == {(name, n) for name in expect for n in (1, 3, 8, 33)}
