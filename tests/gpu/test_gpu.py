"""GPU tests of kaon's CUDA backend, run on the GPU machine by tests/gpu/run_all.sh.

Kernel tests: each op on fresh random inputs (outputs poisoned with NaN first) against a
float64 numpy reference computed from the same bf16-rounded inputs. GGUF block formats against
the `gguf` package's dequantizers. Model tests: Llama / Qwen2 / Qwen3 / Mistral checkpoints with
random bf16 weights built by HF transformers, kaon's logits (prefill, decode, chunked, and many
sequences in shared paged steps) against transformers' own in bf16. GGUF files shaped like the
default model (Q4_1) and with Q4_K/Q6_K tensors: greedy ids on the GPU against our CPU backend.

The driver binary is $KAON_GPU_DRIVER (default $KAON_BUILD/gpu_driver; KAON_BUILD defaults to
<repo>/build); a missing driver fails every test that needs it.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KAON_BUILD", REPO / "build"))
DRIVER = Path(os.environ.get("KAON_GPU_DRIVER", BUILD / "gpu_driver"))
RESULTS = Path(os.environ.get("KAON_GPU_RESULTS", "/tmp/kaon_gpu_results"))
RESULTS.mkdir(parents=True, exist_ok=True)


def driver():
    if not DRIVER.exists():
        pytest.fail(f"{DRIVER} not found: build it (tests/gpu/run_all.sh) or set KAON_GPU_DRIVER")
    return str(DRIVER)


def record(name, **kw):
    """Appends one line of measured figures to results.jsonl (the run's report)."""
    with open(RESULTS / "results.jsonl", "a") as f:
        f.write(json.dumps(dict(test=name, **kw)) + "\n")


def bf16(a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = a.view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return b.view(np.float32)


def rel(out, ref):
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def run_op(tmp, op, params, arrays, env=None):
    tmp.mkdir(parents=True, exist_ok=True)
    lines = [f"op {op}"] + [f"{k} {v}" for k, v in params.items()]
    (tmp / "params.txt").write_text("\n".join(lines) + "\n")
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        assert a.dtype in (np.float32, np.int32, np.uint8), (name, a.dtype)
        a.tofile(tmp / f"{name}.bin")
    p = subprocess.run([driver(), "op", str(tmp)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, **(env or {})))
    assert p.returncode == 0, f"driver failed: {p.stderr}"
    return p.stdout


def out(tmp, name="out", shape=None):
    a = np.fromfile(tmp / f"{name}.bin", dtype=np.float32)
    assert not np.isnan(a).any(), f"{name}: {int(np.isnan(a).sum())} elements never written (NaN poison left)"
    return a.reshape(shape) if shape else a


# ---- kernel tests ------------------------------------------------------------------------------

@pytest.mark.parametrize("n,dim,has_add,inplace", [(7, 4096, 1, 0), (3, 100, 1, 0), (28, 128, 0, 1), (2, 8192, 0, 0)])
def test_rmsnorm(tmp_path, n, dim, has_add, inplace):
    rng = np.random.default_rng()
    x, add = bf16(rng.standard_normal((n, dim)) * 3), bf16(rng.standard_normal((n, dim)))
    w = (1 + 0.2 * rng.standard_normal(dim)).astype(np.float32)
    run_op(tmp_path, "rmsnorm", dict(n=n, dim=dim, has_add=has_add, inplace=inplace, eps=1e-6),
           dict(x=x, add=add, w=w))
    s = bf16(x.astype(np.float64) + add) if has_add else x.astype(np.float64)
    ref = s / np.sqrt((s.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    e = rel(out(tmp_path, shape=(n, dim)), ref)
    record("rmsnorm", n=n, dim=dim, rel_err=e)
    assert e < 1e-2
    if has_add:
        assert rel(out(tmp_path, "out_x", (n, dim)), s) < 1e-2


@pytest.mark.parametrize("n,o,i,bias", [(1, 1000, 4096, 0), (3, 515, 1024, 1), (8, 256, 2048, 0),
                                        (9, 384, 4096, 1), (64, 1024, 512, 0), (300, 2048, 1024, 1),
                                        # batch 1, long rows: 7 rounds of loads (two in flight), 2 and a tail
                                        (1, 515, 14336, 1), (1, 300, 5000, 0), (2, 77, 14336, 0)])
def test_linear(tmp_path, n, o, i, bias):
    rng = np.random.default_rng()
    x, w = bf16(rng.standard_normal((n, i))), bf16(rng.standard_normal((o, i)) / np.sqrt(i))
    b = rng.standard_normal(o).astype(np.float32)
    run_op(tmp_path, "linear", dict(n=n, out=o, **{"in": i}, has_bias=bias), dict(x=x, w=w, b=b))
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + (b if bias else 0)
    e = rel(out(tmp_path, shape=(n, o)), ref)
    record("linear", n=n, out=o, inp=i, rel_err=e)
    assert e < 1e-2


@pytest.mark.parametrize("n", [1, 3, 20])
def test_linear_f32_logits(tmp_path, n):
    rng = np.random.default_rng()
    o, i = 32000, 2048
    x, w = bf16(rng.standard_normal((n, i))), bf16(rng.standard_normal((o, i)) / np.sqrt(i))
    run_op(tmp_path, "linear", dict(n=n, out=o, **{"in": i}, f32out=1), dict(x=x, w=w))
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    got = out(tmp_path, shape=(n, o))
    e = rel(got, ref)
    record("linear_f32", n=n, rel_err=e)
    assert e < 1e-4  # f32 output: no bf16 rounding of the result


@pytest.mark.parametrize("n,bias", [(1, 1), (5, 0), (16, 1)])
def test_linear_multi(tmp_path, n, bias):
    rng = np.random.default_rng()
    i, rows = 1024, (512, 128, 136)
    x = bf16(rng.standard_normal((n, i)))
    arrays = dict(x=x)
    for k, r in enumerate(rows):
        arrays[f"w{k}"] = bf16(rng.standard_normal((r, i)) / 32)
        arrays[f"b{k}"] = rng.standard_normal(r).astype(np.float32)
    so = run_op(tmp_path, "multi", dict(n=n, **{"in": i}, has_bias=bias, out0=rows[0], out1=rows[1], out2=rows[2]), arrays)
    assert json.loads(so)["declined"] == (n > 8)
    for k, r in enumerate(rows):
        ref = x.astype(np.float64) @ arrays[f"w{k}"].T.astype(np.float64) + (arrays[f"b{k}"] if bias else 0)
        assert rel(out(tmp_path, f"out{k}", (n, r)), ref) < 1e-2


@pytest.mark.parametrize("n,o", [(1, 700), (4, 1536), (12, 256)])
def test_linear_silu_mul(tmp_path, n, o):
    rng = np.random.default_rng()
    i = 2048
    x = bf16(rng.standard_normal((n, i)))
    wg, wu = bf16(rng.standard_normal((o, i)) / 45), bf16(rng.standard_normal((o, i)) / 45)
    so = run_op(tmp_path, "silu", dict(n=n, out=o, **{"in": i}), dict(x=x, wg=wg, wu=wu))
    assert json.loads(so)["declined"] == (n > 8)
    g, u = x.astype(np.float64) @ wg.T, x.astype(np.float64) @ wu.T
    ref = g / (1 + np.exp(-g)) * u
    e = rel(out(tmp_path, shape=(n, o)), ref)
    record("linear_silu_mul", n=n, out=o, rel_err=e)
    assert e < 1.5e-2


def rope_ref(x, pos, inv, rot, interleaved):
    x = x.astype(np.float64).copy()
    ang = pos[:, None].astype(np.float32) * inv[None, :].astype(np.float32)  # float product, as kaon
    c, s = np.cos(ang.astype(np.float64))[:, None, :], np.sin(ang.astype(np.float64))[:, None, :]
    half = rot // 2
    if interleaved:
        a, b = x[..., 0:rot:2].copy(), x[..., 1:rot:2].copy()
        x[..., 0:rot:2], x[..., 1:rot:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., :half].copy(), x[..., half:rot].copy()
        x[..., :half], x[..., half:rot] = a * c - b * s, a * s + b * c
    return x


@pytest.mark.parametrize("hd,rot,inter", [(128, 128, 0), (128, 128, 1), (64, 32, 0), (256, 256, 1)])
def test_rope(tmp_path, hd, rot, inter):
    rng = np.random.default_rng()
    n, nh = 9, 6
    x = bf16(rng.standard_normal((n, nh, hd)))
    pos = rng.integers(0, 20000, n).astype(np.int32)
    inv = (500000.0 ** (-np.arange(0, rot, 2) / rot)).astype(np.float32)
    run_op(tmp_path, "rope", dict(n=n, nh=nh, hd=hd, rot=rot, interleaved=inter), dict(x=x, pos=pos, inv=inv))
    e = rel(out(tmp_path, shape=(n, nh, hd)), rope_ref(x, pos, inv, rot, inter))
    record("rope", hd=hd, rot=rot, interleaved=inter, rel_err=e)
    assert e < 1e-2


def test_rope_two_tables(tmp_path):
    """Gemma 3's layers alternate two RoPE tables (local theta 1e4, global 1e6 with linear scaling
    8): each call must rotate with its own table, also when the tables come back."""
    rng = np.random.default_rng()
    n, nh, hd = 7, 4, 256
    x = bf16(rng.standard_normal((n, nh, hd)))
    pos = rng.integers(0, 30000, n).astype(np.int32)
    a = (1e4 ** (-np.arange(0, hd, 2) / hd)).astype(np.float32)
    b = (1e6 ** (-np.arange(0, hd, 2) / hd) / 8).astype(np.float32)
    run_op(tmp_path, "rope", dict(n=n, nh=nh, hd=hd, rot=hd, interleaved=0, n_tables=2),
           dict(x=x, pos=pos, inv=np.concatenate([a, b])))
    for k, name in enumerate(["out", "out1", "out2", "out3"]):
        ref = rope_ref(x, pos, a if k % 2 == 0 else b, hd, 0)
        assert rel(out(tmp_path, name, (n, nh, hd)), ref) < 1e-2, name


def attention_case(rng, ctx, new, nh, nkv, hd, bs, contiguous=False):
    """Sequences with ctx[i] cached positions and new[i] query tokens; blocks scattered.
    contiguous: each sequence's query tokens together, in sequence order (as the engine lays
    out prefill chunks); else interleaved across sequences."""
    S = len(ctx)
    total = [c + n for c, n in zip(ctx, new)]
    mb = max((t + bs - 1) // bs for t in total)
    n_blocks = S * mb + 3
    perm = rng.permutation(n_blocks)[: S * mb].astype(np.int32)
    tables = perm.reshape(S, mb)
    slot_of = lambda s, p: int(tables[s, p // bs]) * bs + p % bs
    K = [bf16(rng.standard_normal((t, nkv, hd))) for t in total]
    V = [bf16(rng.standard_normal((t, nkv, hd))) for t in total]
    ctx_k = np.concatenate([K[s][: ctx[s]] for s in range(S)] + [np.zeros((0, nkv, hd), np.float32)])
    ctx_v = np.concatenate([V[s][: ctx[s]] for s in range(S)] + [np.zeros((0, nkv, hd), np.float32)])
    ctx_slot = np.array([slot_of(s, p) for s in range(S) for p in range(ctx[s])], np.int32)
    # Query tokens interleaved across sequences (as a mixed batch would have them).
    order = [(s, p) for j in range(max(new)) for s in range(S) if j < new[s] for p in [ctx[s] + j]]
    if contiguous:
        order = [(s, ctx[s] + j) for s in range(S) for j in range(new[s])]
    T = len(order)
    q = bf16(rng.standard_normal((T, nh, hd)))
    k = np.stack([K[s][p] for s, p in order])
    v = np.stack([V[s][p] for s, p in order])
    arrays = dict(tables=tables, ctx_slot=ctx_slot, ctx_k=ctx_k, ctx_v=ctx_v, q=q, k=k, v=v,
                  pos=np.array([p for _, p in order], np.int32), seq=np.array([s for s, _ in order], np.int32),
                  slot=np.array([slot_of(s, p) for s, p in order], np.int32))
    params = dict(T=T, n_seqs=S, nh=nh, nkv=nkv, hd=hd, bs=bs, n_blocks=n_blocks, max_blocks=mb,
                  n_ctx=int(sum(ctx)), scale=1 / np.sqrt(hd))
    return arrays, params, order, K, V


def attention_ref(q, order, K, V, nh, nkv, hd, window=0):
    """window > 0: the keys k with p - window < k <= p (HF's kv_idx > q_idx - sliding_window)."""
    g = nh // nkv
    outs = []
    for t, (s, p) in enumerate(order):
        lo = max(0, p - window + 1) if window > 0 else 0
        k, v = K[s][lo: p + 1].astype(np.float64), V[s][lo: p + 1].astype(np.float64)  # [L, nkv, hd]
        qq = q[t].astype(np.float64).reshape(nkv, g, hd)
        sc = np.einsum("cgd,lcd->cgl", qq, k) / np.sqrt(hd)
        w = np.exp(sc - sc.max(-1, keepdims=True))
        outs.append(np.einsum("cgl,lcd->cgd", w / w.sum(-1, keepdims=True), v).reshape(nh, hd))
    return np.stack(outs)


@pytest.mark.parametrize("name,ctx,new,nh,nkv,hd,bs", [
    ("decode", [0, 99, 3000, 700], [1, 1, 1, 1], 32, 8, 128, 16),
    ("prefill", [0, 0], [37, 200], 8, 2, 64, 16),
    ("prefix+decode", [50, 500, 0], [20, 1, 5], 16, 2, 128, 16),
    ("hd256", [300, 0], [1, 9], 16, 2, 256, 32),
    ("long-decode", [9000], [1], 32, 8, 128, 16),
])
def test_attention(tmp_path, name, ctx, new, nh, nkv, hd, bs):
    rng = np.random.default_rng()
    arrays, params, order, K, V = attention_case(rng, ctx, new, nh, nkv, hd, bs)
    run_op(tmp_path, "attn", dict(params, fused=0), arrays)
    ref = attention_ref(arrays["q"], order, K, V, nh, nkv, hd)
    e = rel(out(tmp_path, shape=ref.shape), ref)
    record("attention", case=name, rel_err=e)
    assert e < 1e-2
    # Every new token's K and V landed in its slot.
    kc = np.fromfile(tmp_path / "out_kcache.bin", np.float32).reshape(-1, nkv, hd)
    vc = np.fromfile(tmp_path / "out_vcache.bin", np.float32).reshape(-1, nkv, hd)
    assert np.array_equal(kc[arrays["slot"]], arrays["k"]) and np.array_equal(vc[arrays["slot"]], arrays["v"])


# The tensor-core decode kernel (cuda_attention_decode_tc.cu; KAON_DEC_TC=1: every launch size): GQA groups of 2-16
# heads as the rows of one mma tile, contexts around its 32-key tiles and 256-key ranges, split
# contexts, windows (blocks before them unmapped), several decode tokens of one sequence.
DEC_TC_CASES = [
    # name, cached positions, new tokens, nh, nkv, hd, block size, window
    ("g4-edges", [0, 1, 30, 31, 32, 33, 255, 256, 257, 700], [1] * 10, 32, 8, 128, 16, 0),
    ("g4-long", [9000, 3000], [1, 1], 32, 8, 128, 16, 0),
    ("g8-bs256", [0, 2000, 4095], [1, 1, 1], 32, 4, 128, 256, 0),
    ("g2-hd64", [5, 600, 4095], [1, 1, 1], 8, 4, 64, 16, 0),
    ("g16", [100, 1500], [1, 1], 16, 1, 128, 16, 0),
    ("g7", [77, 1000], [1, 1], 14, 2, 128, 16, 0),
    ("multi-token", [300, 1000], [3, 2], 16, 4, 128, 16, 0),
    ("window", [0, 99, 3000, 700, 4000], [1] * 5, 8, 2, 128, 16, 512),
    ("window-7", [3000, 40], [1, 1], 8, 2, 64, 16, 7),
]


@pytest.mark.parametrize("name,ctx,new,nh,nkv,hd,bs,window", DEC_TC_CASES)
def test_attention_decode_tc(tmp_path, name, ctx, new, nh, nkv, hd, bs, window):
    rng = np.random.default_rng()
    arrays, params, order, K, V = attention_case(rng, ctx, new, nh, nkv, hd, bs)
    if window:
        punch_window_holes(arrays, order, bs, window)
    run_op(tmp_path, "attn", dict(params, fused=0, window=window), arrays, env={"KAON_DEC_TC": "1"})
    ref = attention_ref(arrays["q"], order, K, V, nh, nkv, hd, window)
    got = out(tmp_path, shape=ref.shape)
    d = np.linalg.norm(got.astype(np.float64) - ref, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), 1e-30)
    record("attention_decode_tc", case=name, rel_err=rel(got, ref), worst_row=float(d.max()))
    assert rel(got, ref) < 1e-2
    assert d.max() < 3e-2, (name, float(d.max()), np.unravel_index(int(np.argmax(d)), d.shape))


# Prefill chunks laid out as the engine does (each sequence's tokens together): runs of >= 16
# tokens take the tensor-core kernel (cuda_attention_prefill.cu), the rest the split-K one.
FA_CASES = [
    # name, cached positions, new tokens (per sequence), nh, nkv, hd, block size
    ("fa-lengths-g4", [0] * 10, [1, 15, 16, 17, 33, 64, 65, 127, 129, 300], 8, 2, 128, 16),
    ("fa-lengths-g1", [0] * 7, [16, 31, 63, 128, 129, 200, 300], 4, 4, 64, 16),
    ("fa-prefix-hit", [1000], [200], 32, 8, 128, 16),
    ("fa-two-prefixes", [37, 555], [100, 77], 8, 8, 64, 16),
    ("fa-g8-bs256", [0, 20], [130, 45], 32, 4, 128, 256),
    ("fa-g7", [5], [90], 14, 2, 128, 16),
    ("fa-hd64-bs256", [300], [256], 16, 4, 64, 256),
    ("fa-hd256", [0, 64], [70, 40], 8, 2, 256, 32),
    ("fa-mixed-decode", [0, 3000, 50, 7], [150, 1, 20, 3], 16, 4, 128, 16),
    ("fa-mha128", [0], [200], 4, 4, 128, 16),
    ("fa-long-g8", [0], [1100], 8, 1, 128, 16),
]


# The step's other tokens: the tensor-core decode kernel over just them (a list made by
# begin_step), or the CUDA-core kernel over every row (KAON_DEC_TC=0; graphed steps do that).
# fa: the prefill kernel, mma.sync (every head dim; KAON_FA_WGMMA=0) or the Hopper wgmma one (the
# default on compute capability 9.0, cuda_attention_prefill_wgmma.cu: head_dim 128 only).
@pytest.mark.parametrize("fa", ["mma", "wgmma"])
@pytest.mark.parametrize("dec", ["tc", "cudacore"])
@pytest.mark.parametrize("name,ctx,new,nh,nkv,hd,bs", FA_CASES)
def test_attention_prefill(tmp_path, name, ctx, new, nh, nkv, hd, bs, dec, fa):
    if fa == "wgmma" and hd != 128:
        pytest.skip("the wgmma prefill kernel is head_dim 128 only")
    rng = np.random.default_rng()
    arrays, params, order, K, V = attention_case(rng, ctx, new, nh, nkv, hd, bs, contiguous=True)
    env = {"KAON_DEC_TC": "1" if dec == "tc" else "0"}
    env["KAON_FA_WGMMA"] = "1" if fa == "wgmma" else "0"
    run_op(tmp_path, "attn", dict(params, fused=0), arrays, env=env)
    ref = attention_ref(arrays["q"], order, K, V, nh, nkv, hd)
    got = out(tmp_path, shape=ref.shape)
    e = rel(got, ref)
    # Per (token, head) too: a wrong row or tile edge must not hide in the global norm.
    d = np.linalg.norm(got.astype(np.float64) - ref, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), 1e-30)
    worst = np.unravel_index(int(np.argmax(d)), d.shape)
    record("attention_prefill", case=name, fa=fa, rel_err=e, worst_row=float(d.max()),
           worst_at=dict(token=int(worst[0]), seq=int(order[worst[0]][0]), pos=int(order[worst[0]][1]), head=int(worst[1])))
    assert e < 1e-2
    assert d.max() < 3e-2, (name, float(d.max()), order[worst[0]], int(worst[1]))


# Sliding-window attention (Gemma 3's local layers): decode tokens (the streaming kernel, and
# its split contexts inside the window), prefill runs (the tensor-core kernel: tiles before the
# window skipped, the edge masked) and the split-K kernel where neither has an instance (hd 96;
# hd 256 with 8 query heads per KV head) or where the environment turns them off. Blocks before
# every window of their sequence are taken out of the tables (-1): they must not be read.
WINDOW_CASES = [
    # name, cached positions, new tokens, nh, nkv, hd, block size, prefill layout, env
    ("dec-hd128", [0, 99, 3000, 700, 4000], [1] * 5, 8, 2, 128, 16, False, None),
    ("dec-hd64-g1", [5, 600, 4095], [1, 1, 1], 4, 4, 64, 16, False, None),
    ("dec-hd256-g4", [0, 511, 512, 513, 4000], [1] * 5, 4, 1, 256, 16, False, None),  # Gemma 3 270M/1B heads
    ("dec-multi-token", [300, 1000], [3, 2], 8, 4, 256, 16, False, None),  # interleaved: no prefill run
    ("pre-hd256-g4", [0, 300, 3000], [700, 40, 129], 4, 1, 256, 16, True, None),
    ("pre-hd128", [0, 1000], [600, 200], 16, 8, 128, 16, True, None),
    ("pre-hd64-bs256", [0, 2000], [300, 100], 8, 2, 64, 256, True, None),
    ("mixed-hd256", [0, 3000, 50, 7], [530, 1, 20, 3], 8, 2, 256, 32, True, None),
    ("fallback-hd256-g8", [0, 2000], [40, 1], 8, 1, 256, 16, True, None),
    ("fallback-hd96", [0, 1500], [50, 1], 4, 2, 96, 16, True, None),
    ("splitk-forced", [0, 2500, 9], [300, 1, 1], 8, 2, 128, 16, True, {"KAON_FA": "0", "KAON_DECODE_ATTN": "0"}),
]


def punch_window_holes(arrays, order, bs, window):
    """Sets to -1 the table entries of blocks that hold no key of any window of their sequence."""
    tables = arrays["tables"].copy()
    for s in range(tables.shape[0]):
        ps = [p for ss, p in order if ss == s]
        first = min(ps) - window + 1 if ps else 0  # the lowest key any of s's tokens keeps
        for blk in range(tables.shape[1]):
            if (blk + 1) * bs <= first:
                tables[s, blk] = -1
    arrays["tables"] = tables
    return int((tables < 0).sum())


@pytest.mark.parametrize("window", [1, 7, 512])
@pytest.mark.parametrize("name,ctx,new,nh,nkv,hd,bs,contig,env", WINDOW_CASES)
def test_attention_window(tmp_path, name, ctx, new, nh, nkv, hd, bs, contig, env, window):
    rng = np.random.default_rng()
    arrays, params, order, K, V = attention_case(rng, ctx, new, nh, nkv, hd, bs, contiguous=contig)
    holes = punch_window_holes(arrays, order, bs, window)
    run_op(tmp_path, "attn", dict(params, fused=0, window=window), arrays, env=env)
    ref = attention_ref(arrays["q"], order, K, V, nh, nkv, hd, window)
    got = out(tmp_path, shape=ref.shape)
    e = rel(got, ref)
    d = np.linalg.norm(got.astype(np.float64) - ref, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), 1e-30)
    worst = np.unravel_index(int(np.argmax(d)), d.shape)
    record("attention_window", case=name, window=window, holes=holes, rel_err=e, worst_row=float(d.max()),
           worst_at=dict(seq=int(order[worst[0]][0]), pos=int(order[worst[0]][1]), head=int(worst[1])))
    assert e < 1e-2
    assert d.max() < 3e-2, (name, window, float(d.max()), order[worst[0]], int(worst[1]))


@pytest.mark.parametrize("inter,rot", [(0, 128), (1, 128), (0, 64)])
def test_rope_kv_write_attention(tmp_path, inter, rot):
    rng = np.random.default_rng()
    nh, nkv, hd = 16, 4, 128
    arrays, params, order, K, V = attention_case(rng, [40, 0, 200], [1, 6, 1], nh, nkv, hd, 16)
    inv = (1e6 ** (-np.arange(0, rot, 2) / rot)).astype(np.float32)
    arrays["inv"] = inv
    run_op(tmp_path, "attn", dict(params, fused=1, rot=rot, interleaved=inter), arrays)
    pos = arrays["pos"]
    q_ref = rope_ref(arrays["q"], pos, inv, rot, inter)
    k_ref = rope_ref(arrays["k"], pos, inv, rot, inter)
    assert rel(out(tmp_path, "out_q", q_ref.shape), q_ref) < 1e-2
    kc = np.fromfile(tmp_path / "out_kcache.bin", np.float32).reshape(-1, nkv, hd)
    assert rel(kc[arrays["slot"]], k_ref) < 1e-2
    # Attention over the cached (unrotated) context plus the rotated new keys.
    Kr = [k.copy() for k in K]
    for t, (s, p) in enumerate(order):
        Kr[s][p] = bf16(k_ref[t])
    ref = attention_ref(bf16(q_ref), order, Kr, V, nh, nkv, hd)
    e = rel(out(tmp_path, shape=ref.shape), ref)
    record("rope_kv_write+attention", interleaved=inter, rot=rot, rel_err=e)
    assert e < 1.5e-2


def test_embed_get_rows(tmp_path):
    rng = np.random.default_rng()
    V, dim, n = 5000, 576, 11
    table = bf16(rng.standard_normal((V, dim)))
    ids = rng.integers(0, V, n).astype(np.int32)
    rows = np.array([10, 0, 3, 3], np.int32)
    run_op(tmp_path, "embed", dict(vocab=V, dim=dim, n=n, n_rows=len(rows)), dict(table=table, ids=ids, rows=rows))
    e = out(tmp_path, shape=(n, dim))
    assert np.array_equal(e, table[ids])
    assert np.array_equal(out(tmp_path, "out_rows", (len(rows), dim)), table[ids][rows])


# ---- sampling on the device ----------------------------------------------------------------------

def sampling_dist(logits, T, top_k=0, top_p=1.0, min_p=0.0, bias=(), seen=(), out=(), rep=1.0, pres=0.0, freq=0.0):
    """The host sampler's distribution (src/engine/sampler.c + penalties.c) in float64."""
    w = logits.astype(np.float64).copy()
    for t, v in bias:
        w[t] += v
    for t in seen:
        w[t] = w[t] / rep if w[t] > 0 else w[t] * rep
    for t, c in out:
        w[t] -= (pres if c > 0 else 0.0) + freq * c
    probs = np.zeros_like(w)
    if T <= 0:
        probs[int(np.argmax(w))] = 1
        return probs, w
    order = np.lexsort((np.arange(len(w)), -w))
    p = np.exp((w[order] - w[order[0]]) / T)
    m = len(p)
    if top_k > 0:
        m = min(m, top_k)
    if min_p > 0:
        k = 1
        while k < m and p[k] >= p[0] * min_p:
            k += 1
        m = k
    if top_p < 1:
        total, acc, k = p[:m].sum(), 0.0, 0
        while k < m:
            acc += p[k]
            k += 1
            if acc >= top_p * total:
                break
        m = k
    probs[order[:m]] = p[:m] / p[:m].sum()
    return probs, w


def chi2_ok(counts, probs, n):
    """Pearson's chi-square against probs (bins with expected < 5 pooled), at p = 1e-5."""
    exp_c = probs * n
    big = exp_c >= 5
    obs = list(counts[big]) + [counts[~big].sum()]
    ex = list(exp_c[big]) + [exp_c[~big].sum()]
    obs, ex = np.array(obs, float), np.array(ex, float)
    keep = ex > 0
    stat = float((((obs - ex) ** 2)[keep] / ex[keep]).sum())
    df = max(int(keep.sum()) - 1, 1)
    z = 4.265
    crit = df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3
    return stat, crit


SAMPLE_CASES = {
    "greedy": dict(T=0.0),
    "temperature": dict(T=0.8),
    "top_k": dict(T=1.0, top_k=20),
    "top_p": dict(T=1.0, top_p=0.7),
    "min_p": dict(T=1.3, min_p=0.05),
    "all": dict(T=0.9, top_k=50, top_p=0.9, min_p=0.02),
    "penalties": dict(T=1.0, top_k=40, bias=[(3, 2.0), (7, -np.inf), (11, -1.5)], seen=[0, 1, 2, 3, 4, 5],
                      out=[(2, 1.0), (5, 3.0), (9, 2.0)], rep=1.4, pres=0.6, freq=0.3),
}


@pytest.mark.parametrize("name", list(SAMPLE_CASES))
def test_device_sampling(tmp_path, name):
    c = SAMPLE_CASES[name]
    rng = np.random.default_rng(7)
    V, D = 1000, 20000
    logits = (rng.standard_normal(V) * 2.5).astype(np.float32)
    logits[:12] += 4.0  # the edited tokens matter
    params = dict(vocab=V, draws=D, temperature=c["T"], top_k=c.get("top_k", 0), top_p=c.get("top_p", 1.0),
                  min_p=c.get("min_p", 0.0), repetition=c.get("rep", 1.0), presence=c.get("pres", 0.0),
                  frequency=c.get("freq", 0.0), want_logprob=0 if "bias" in c else 1,
                  n_bias=len(c.get("bias", ())), n_seen=len(c.get("seen", ())), n_out=len(c.get("out", ())))
    arrays = {"logits": logits}
    if c.get("bias"):
        arrays["bias_tok"] = np.array([t for t, _ in c["bias"]], np.int32)
        arrays["bias_val"] = np.array([v for _, v in c["bias"]], np.float32)
    if c.get("seen"):
        arrays["seen"] = np.array(c["seen"], np.int32)
    if c.get("out"):
        arrays["out_tok"] = np.array([t for t, _ in c["out"]], np.int32)
        arrays["out_cnt"] = np.array([n for _, n in c["out"]], np.float32)
    run_op(tmp_path, "sample", params, arrays)
    ids = out(tmp_path).astype(np.int64)
    probs, _ = sampling_dist(logits, c["T"], c.get("top_k", 0), c.get("top_p", 1.0), c.get("min_p", 0.0),
                             c.get("bias", ()), c.get("seen", ()), c.get("out", ()), c.get("rep", 1.0),
                             c.get("pres", 0.0), c.get("freq", 0.0))
    assert ids.min() >= 0 and ids.max() < V
    outside = int((probs[ids] == 0).sum())
    counts = np.bincount(ids, minlength=V)
    stat, crit = (0.0, 0.0) if c["T"] <= 0 else chi2_ok(counts, probs, D)
    record(f"sample_{name}", outside=outside, chi2=stat, crit=crit, support=int((probs > 0).sum()),
           distinct=int((counts > 0).sum()))
    assert outside == 0, f"{outside} draws outside the kept set"
    if c["T"] <= 0:
        assert (ids == int(np.argmax(logits))).all()
    else:
        assert stat < crit, f"chi-square {stat:.1f} >= {crit:.1f}"
    if params["want_logprob"]:
        lp = out(tmp_path, "out_lp")
        x = logits.astype(np.float64)
        ref = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
        assert np.abs(lp - ref[ids]).max() < 1e-3


def test_silu_mul(tmp_path):
    rng = np.random.default_rng()
    n, dim = 5, 3000
    g, u = bf16(rng.standard_normal((n, dim)) * 3), bf16(rng.standard_normal((n, dim)))
    run_op(tmp_path, "silu_mul", dict(n=n, dim=dim), dict(g=g, u=u))
    ref = g / (1 + np.exp(-g.astype(np.float64))) * u
    assert rel(out(tmp_path, shape=(n, dim)), ref) < 1e-2


def test_gelu_tanh_mul(tmp_path):
    """gelu_pytorch_tanh(gate) * up (Gemma 3's MLP), rounded as HF's bf16: bf16(bf16(gelu) * up)."""
    rng = np.random.default_rng()
    n, dim = 5, 2051
    g, u = bf16(rng.standard_normal((n, dim)) * 3), bf16(rng.standard_normal((n, dim)))
    g[0, :6] = [-100, 100, 0, -9, -20, 5.5]
    run_op(tmp_path, "gelu_mul", dict(n=n, dim=dim), dict(g=g, u=u))
    x = g.astype(np.float64)
    ref = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))) * u
    got = out(tmp_path, shape=(n, dim))
    e = rel(got, ref)
    record("gelu_tanh_mul", rel_err=e)
    assert e < 1e-2
    assert np.all(np.abs(got - ref) <= 8e-3 * np.abs(ref) + 1e-6)  # two bf16 roundings per element


@pytest.mark.parametrize("n,s", [(3 * 640 + 7, float(np.sqrt(640))), (5 * 1152, float(bf16([np.sqrt(1152)])[0]))])
def test_scale(tmp_path, n, s):
    """x *= s (Gemma's embedding scale): bf16(x * s) with the product in f32, to the bit."""
    rng = np.random.default_rng()
    x = bf16(rng.standard_normal(n) * 0.05)
    run_op(tmp_path, "scale", dict(n=n, s=repr(s)), dict(x=x))
    want = x * np.float32(s)
    if os.environ.get("KAON_OP_DEVICE") != "cpu":  # (the CPU harness check keeps f32 activations)
        want = bf16(want)
    assert np.array_equal(out(tmp_path), want)


def block_of(qtype):
    """(elements, bytes) of one block of a ggml type."""
    import gguf
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]


def random_blocks(rng, qtype, n_blocks):
    """Random GGUF blocks with sane f16 scales (random bytes elsewhere)."""
    bsz = block_of(qtype)[1]
    raw = rng.integers(0, 256, (n_blocks, bsz), dtype=np.uint8)

    def put(off, v):
        raw[:, off:off + 2] = v.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    # Scales that keep weights around +-0.1 and (for the formats with a minimum) centred on 0,
    # so random models do not collapse onto one token; the quants are random bytes.
    # (Weights of about 1/sqrt(in) keep a 30-layer random model from amplifying rounding
    # differences into different tokens.)
    d = rng.uniform(0.5, 1.0, n_blocks)
    if qtype == 2:
        put(0, 0.012 * d)
    elif qtype == 8:
        put(0, 0.002 * d)
    elif qtype == 3:
        put(0, 0.01 * d)
        put(2, -7.5 * 0.01 * d)
    elif qtype == 12:
        put(0, 0.0003 * d)
        put(2, 7.5 * 0.0003 * d)
    elif qtype == 14:
        put(208, 0.00008 * d)
    elif qtype == 6:  # Q5_0: d (q - 16)
        put(0, 0.006 * d)
    elif qtype == 7:  # Q5_1: d q + m, q in 0..31
        put(0, 0.005 * d)
        put(2, -15.5 * 0.005 * d)
    elif qtype == 20:  # IQ4_NL: d times levels of up to 127
        put(0, 0.0008 * d)
    elif qtype == 10:  # Q2_K: (d sc) q - dmin m, sc and m 0..15, q 0..3
        put(80, 0.004 * d)
        put(82, 1.5 * 0.004 * d)
    elif qtype == 11:  # Q3_K: (d sc) q, sc -32..31, q -4..3
        put(108, 0.0008 * d)
    elif qtype == 13:  # Q5_K: as Q4_K with q 0..31
        put(0, 0.00015 * d)
        put(2, 15.5 * 0.00015 * d)
    elif qtype == 23:  # IQ4_XS: d (ls - 32) times levels of up to 127
        put(0, 0.00003 * d)
    return raw


# Every GGUF format the CUDA backend keeps quantized: (name, ggml type id).
QTYPES = [("Q4_0", 2), ("Q4_1", 3), ("Q5_0", 6), ("Q5_1", 7), ("Q8_0", 8), ("IQ4_NL", 20), ("Q2_K", 10),
          ("Q3_K", 11), ("Q4_K", 12), ("Q5_K", 13), ("Q6_K", 14), ("IQ4_XS", 23)]


@pytest.mark.parametrize("qname,qtype", QTYPES)
def test_dequant_matches_gguf(tmp_path, qname, qtype):
    import gguf
    rng = np.random.default_rng()
    rows, cols = 37, 1024
    qk = block_of(qtype)[0]
    raw = random_blocks(rng, qtype, rows * cols // qk)
    run_op(tmp_path, "dequant", dict(type=qtype, rows=rows, cols=cols), dict(raw=raw))
    ref = gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType(qtype)).reshape(rows, cols)
    got = out(tmp_path, shape=(rows, cols))
    # Exactly the reference rounded to bf16 (or within one bf16 step of it).
    err = np.abs(got - ref.astype(np.float64))
    assert (err <= np.abs(ref) * 2.0 ** -8 + 1e-30).all(), f"{qname}: max err {err.max()}"


# ---- models against HF transformers --------------------------------------------------------------

SMALL = {
    "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=512,
                  intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                  vocab_size=1000, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=500000.0,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
                  tie_word_embeddings=False, attention_bias=False, mlp_bias=False, head_dim=64),
    "mistral": dict(architectures=["MistralForCausalLM"], model_type="mistral", hidden_size=512,
                    intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                    vocab_size=1000, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=1000000.0,
                    tie_word_embeddings=False, sliding_window=None, head_dim=64),
    "qwen2": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=512,
                  intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                  vocab_size=1000, max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  tie_word_embeddings=True, use_sliding_window=False),
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=512,
                  intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                  head_dim=128, vocab_size=1000, max_position_embeddings=4096, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False),
}


def real_size(config_file, layers):
    cfg = json.loads((REPO / "bench" / "configs" / config_file).read_text())
    cfg["num_hidden_layers"] = layers
    cfg.pop("quantization_config", None)
    return cfg


BIG = {
    "llama3.1-8b-2layers": lambda: real_size("meta-llama__Llama-3.1-8B.json", 2),
    "qwen3-8b-2layers": lambda: real_size("Qwen__Qwen3-8B.json", 2),
}


def build_hf(folder, cfg, init_std, seed=None):
    """Random bf16 weights: transformers builds the model from our config.json (legacy keys,
    as hub configs have them); we write model.safetensors."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    cfg = dict(cfg, torch_dtype="bfloat16", initializer_range=init_std)
    (folder / "config.json").write_text(json.dumps(cfg))
    hcfg = AutoConfig.from_pretrained(folder)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little") if seed is None else seed)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(hcfg, attn_implementation="eager")
    model = model.to(torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
            elif p.dim() == 2:  # whatever transformers' own init did
                p.copy_(init_std * torch.randn_like(p))
    sd = {}
    for k, v in model.state_dict().items():
        if cfg.get("tie_word_embeddings") and k == "lm_head.weight":
            continue
        sd[k] = v.detach().to(torch.bfloat16).contiguous().cpu().clone()
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return model


def hf_logits(model, ids):
    import torch
    with torch.no_grad():
        x = torch.tensor([ids], device="cuda")
        return model(input_ids=x).logits[0].float().cpu().numpy()


def kaon_logits(folder, dev, chunk, ids, V, tmp, env=None):
    o = tmp / f"k_{dev}_{chunk}.f32"
    p = subprocess.run([driver(), "logits", str(folder), dev, str(chunk), ",".join(map(str, ids)), str(o)],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, **(env or {})))
    assert p.returncode == 0, p.stderr
    return np.fromfile(o, np.float32).reshape(len(ids), V)


def kaon_batch(folder, dev, seqs, V, tmp):
    f, o = tmp / "seqs.txt", tmp / f"b_{dev}.f32"
    f.write_text("\n".join(",".join(map(str, s)) for s in seqs) + "\n")
    p = subprocess.run([driver(), "batch", str(folder), dev, str(f), str(o)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    return np.fromfile(o, np.float32).reshape(-1, V)


def agreement(k, h):
    srt = np.sort(h, axis=-1)
    margin = srt[:, -1] - srt[:, -2]
    sel = margin > 0.1
    agree = (k.argmax(-1) == h.argmax(-1))[sel]
    return float(agree.mean()) if sel.any() else 1.0, int(sel.sum())


def check_model(name, cfg, tmp, init_std, n_tok=48, cpu_too=True):
    import torch
    folder = tmp / name
    model = build_hf(folder, cfg, init_std)
    V = cfg["vocab_size"]
    rng = np.random.default_rng()
    ids = rng.integers(0, V, n_tok).tolist()
    ref = hf_logits(model, ids)
    seqs = [rng.integers(0, V, n).tolist() for n in (23, 40, 9)]
    refs = np.concatenate([hf_logits(model, s) for s in seqs])
    model32 = model.float()
    ref32 = hf_logits(model32, ids)
    del model, model32
    torch.cuda.empty_cache()
    results = {"hf_bf16_vs_fp32": rel(ref, ref32)}
    runs = {"prefill": (ids, kaon_logits(folder, "cuda", n_tok, ids, V, tmp), ref),
            "decode": (ids, kaon_logits(folder, "cuda", 1, ids, V, tmp), ref),
            "chunked5": (ids, kaon_logits(folder, "cuda", 5, ids, V, tmp), ref),
            "batch3": (None, kaon_batch(folder, "cuda", seqs, V, tmp), refs)}
    for mode, (_, k, h) in runs.items():
        e = rel(k, h)
        a, n_sel = agreement(k, h)
        results[mode] = dict(rel_err=e, top1=a, positions=n_sel, rel_err_vs_fp32=rel(k, ref32) if mode != "batch3" else None)
    if cpu_too:
        kc = kaon_logits(folder, "cpu", n_tok, ids, V, tmp)
        results["cpu_vs_hf"] = rel(kc, ref)
        results["cuda_vs_cpu"] = rel(runs["prefill"][1], kc)
    record("model", model=name, **results)
    print(name, json.dumps(results))
    for mode in runs:
        assert results[mode]["rel_err"] <= 2e-2, (mode, results[mode])
        assert results[mode]["top1"] >= 0.99, (mode, results[mode])


@pytest.mark.parametrize("name", list(SMALL))
def test_model_small_vs_transformers(tmp_path, name):
    # transformers' default initializer_range: with larger weights the random 4-layer models
    # amplify bf16 rounding until HF's own bf16 logits are 2% from its fp32 ones.
    check_model(name, SMALL[name], tmp_path, init_std=0.02)


@pytest.mark.parametrize("name", list(BIG))
def test_model_real_size_vs_transformers(tmp_path, name):
    if os.environ.get("KAON_GPU_SKIP_BIG") == "1":
        pytest.skip("KAON_GPU_SKIP_BIG=1")
    check_model(name, BIG[name](), tmp_path, init_std=0.02, n_tok=40, cpu_too=False)


def kernel_names(tmp, run):
    """The kernels run(env) launched, through tests/gpu/kernel_trace.c (CUPTI)."""
    lib = tmp / "libkaon_trace.so"
    if not lib.exists():
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-I/usr/local/cuda/include", str(REPO / "tests/gpu/kernel_trace.c"),
                        "-L/usr/local/cuda/lib64", "-L/usr/local/cuda/extras/CUPTI/lib64", "-lcupti", "-lstdc++", "-o",
                        str(lib)], check=True)
    csv = tmp / "trace.csv"
    csv.unlink(missing_ok=True)
    out = run({"CUDA_INJECTION64_PATH": str(lib), "KAON_TRACE_OUT": str(csv)})
    return out, {line.split(",", 7)[7] for line in csv.read_text().splitlines() if line.count(",") >= 7}


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen2-hd128", "qwen3", "llama3.1-8b-2layers"])
def test_norm_split_vs_transformers(tmp_path, name):
    """Batch-1 decode with the RMSNorm split around the GEMVs (the default: the output GEMVs add
    into the residual stream and leave x * w and its sums of squares, the next GEMVs scale by
    1 / rms; with 128-wide heads and no q/k norm the qkv GEMV also rotates q and k and writes the
    KV cache) against transformers, as close as the separate ops (KAON_NORM_SPLIT=0), and the
    split kernels did run (and not with it off)."""
    if name in BIG and os.environ.get("KAON_GPU_SKIP_BIG") == "1":
        pytest.skip("KAON_GPU_SKIP_BIG=1")
    import torch
    if name == "qwen2-hd128":  # q / k / v biases, 128-wide heads: the fused RoPE and KV write
        cfg = dict(SMALL["qwen2"], num_attention_heads=4, num_key_value_heads=2)
    else:
        cfg = SMALL[name] if name in SMALL else BIG[name]()
    folder = tmp_path / name
    model = build_hf(folder, cfg, init_std=0.02)
    V = cfg["vocab_size"]
    ids = np.random.default_rng().integers(0, V, 24).tolist()
    ref = hf_logits(model, ids)
    del model
    torch.cuda.empty_cache()
    split, ks = kernel_names(tmp_path, lambda env: kaon_logits(folder, "cuda", 1, ids, V, tmp_path,
                                                               dict(env, KAON_QKV_ROPE="1")))
    plain, kp = kernel_names(tmp_path, lambda env: kaon_logits(folder, "cuda", 1, ids, V, tmp_path,
                                                               dict(env, KAON_NORM_SPLIT="0")))
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rope_fused = hd == 128 and name != "qwen3"  # Qwen3's q / k norms come between the GEMV and RoPE
    split_kernels = ("void k_gemv<1, 1, 1>(", "k_gemv_qkv_rope(" if rope_fused else "void k_gemv<1, 1, 2>(",
                     "void k_gemv_silu<1, 1, true>(")
    for kern in split_kernels:
        assert any(k.startswith(kern) for k in ks), (kern, sorted(ks))
        assert not any(k.startswith(kern) for k in kp), (kern, sorted(kp))
    e_split, e_plain = rel(split, ref), rel(plain, ref)
    a_split, n_sel = agreement(split, ref)
    record("norm_split", model=name, rel_err=e_split, rel_err_plain=e_plain, top1=a_split, positions=n_sel,
           split_vs_plain=rel(split, plain))
    assert e_split <= 2e-2 and a_split >= 0.99, (e_split, a_split)
    assert e_split <= 1.5 * e_plain + 1e-3, (e_split, e_plain)


@pytest.mark.parametrize("name", ["qwen3", "qwen3-8b-2layers"])
@pytest.mark.parametrize("chunk", [1, 5])
def test_qk_norm_fused_bit_equal(tmp_path, name, chunk):
    """Qwen3's q / k head norms folded into the RoPE + KV-write kernel (qk_norm_rope_kv_write,
    k_rope_kv_write<true, true>): the same logits, bit for bit, as the norm kernels apart
    (KAON_QK_NORM_FUSE=0), one token a step and in chunks; the fused kernel ran, and not with it off."""
    if name in BIG and os.environ.get("KAON_GPU_SKIP_BIG") == "1":
        pytest.skip("KAON_GPU_SKIP_BIG=1")
    import torch
    cfg = SMALL[name] if name in SMALL else BIG[name]()
    folder = tmp_path / name
    build_hf(folder, cfg, init_std=0.02)  # (the model it returns is dropped)
    torch.cuda.empty_cache()
    V = cfg["vocab_size"]
    ids = np.random.default_rng().integers(0, V, 20).tolist()
    fused, kf = kernel_names(tmp_path, lambda env: kaon_logits(folder, "cuda", chunk, ids, V, tmp_path, env))
    apart, ka = kernel_names(tmp_path, lambda env: kaon_logits(folder, "cuda", chunk, ids, V, tmp_path,
                                                               dict(env, KAON_QK_NORM_FUSE="0")))
    kern = "void k_rope_kv_write<true, true>("
    assert any(k.startswith(kern) for k in kf), sorted(kf)
    assert not any(k.startswith(kern) for k in ka), sorted(ka)
    record("qk_norm_fused", model=name, chunk=chunk, max_abs_diff=float(np.abs(fused - apart).max()))
    assert np.array_equal(fused, apart), float(np.abs(fused - apart).max())


# ---- GGUF: GPU greedy ids against our CPU backend -------------------------------------------------

def write_gguf(path, arch_cfg, qtypes, rng, arch="llama"):
    """A llama GGUF with random quantized blocks. qtypes: tensor role -> ggml type id. arch "qwen2":
    NeoX rotary pairs (llama files rotate adjacent ones) and q / k / v biases."""
    import gguf
    c = arch_cfg
    d, f, V, L = c["dim"], c["ffn"], c["vocab"], c["layers"]
    nh, nkv = c["heads"], c["kv_heads"]
    hd = d // nh
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(L)
    w.add_context_length(2048)
    w.add_embedding_length(d)
    w.add_feed_forward_length(f)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(100000.0)
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(V)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)

    def mat(name, role, rows, cols):
        t = qtypes[role]
        qk, bsz = block_of(t)
        raw = random_blocks(rng, t, rows * cols // qk).reshape(rows, cols // qk * bsz)
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType(t))

    def norm(name, n):
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(n)).astype(np.float32))
    mat("token_embd.weight", "embd", V, d)
    norm("output_norm.weight", d)
    if "out" in qtypes:
        mat("output.weight", "out", V, d)
    for l in range(L):
        norm(f"blk.{l}.attn_norm.weight", d)
        norm(f"blk.{l}.ffn_norm.weight", d)
        mat(f"blk.{l}.attn_q.weight", "attn", d, d)
        mat(f"blk.{l}.attn_k.weight", "attn", nkv * hd, d)
        mat(f"blk.{l}.attn_v.weight", "attn", nkv * hd, d)
        if arch == "qwen2":
            for t, n in (("q", d), ("k", nkv * hd), ("v", nkv * hd)):
                w.add_tensor(f"blk.{l}.attn_{t}.bias", (0.1 * rng.standard_normal(n)).astype(np.float32))
        mat(f"blk.{l}.attn_output.weight", "attn", d, d)
        mat(f"blk.{l}.ffn_gate.weight", "ffn", f, d)
        mat(f"blk.{l}.ffn_up.weight", "ffn", f, d)
        mat(f"blk.{l}.ffn_down.weight", "down", d, f)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


GGUF_FILES = {
    # SmolLM2-135M's shape and types: Q8_0 embedding (tied), Q4_1 matrices, F32 norms.
    "smollm2-shape-q4_1": (dict(dim=576, ffn=1536, vocab=49152, layers=30, heads=9, kv_heads=3),
                           dict(embd=8, attn=3, ffn=3, down=3)),
    # K-quants (dims multiples of 256): Q4_K matrices, Q6_K down and output, Q8_0 embedding.
    "kquants-q4_k-q6_k": (dict(dim=512, ffn=1536, vocab=32000, layers=8, heads=8, kv_heads=2),
                          dict(embd=8, attn=12, ffn=12, down=14, out=14)),
}


def greedy(path, dev, ids, n):
    p = subprocess.run([driver(), "greedy", str(path), dev, ",".join(map(str, ids)), str(n)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("name", list(GGUF_FILES))
def test_gguf_gpu_as_accurate_as_cpu(tmp_path, name):
    # Greedy ids of the two backends cannot match token for token on these random-weight files:
    # logits are flat (3-way near-ties), the CPU quantizes activations to 8 bits for its
    # quantized dot products and the GPU's residual stream is bf16. What must hold is that the
    # GPU is as accurate as the CPU backend: both are measured against a float32 numpy forward
    # pass of the gguf package's dequantized weights, on the CPU's greedy continuation (teacher
    # forcing), the GPU both one token per step (decode kernels) and whole sequences (prefill).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ref"))
    from gguf_files import load_gguf_reference
    from refmodel import RefModel
    rng = np.random.default_rng(1234 + len(name))
    shape, qtypes = GGUF_FILES[name]
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, shape, qtypes, rng)
    V = shape["vocab"]
    cfg, w, _ = load_gguf_reference(path)
    cfg["vocab_size"] = V
    report = []
    for p in range(4):
        prompt = rng.integers(3, V, 5 + 7 * p).tolist()
        ids = prompt + [x[0] for x in greedy(path, "cpu", prompt, 64)]
        exact = RefModel(cfg, w, dtype=np.float32).forward(ids)
        row = dict(prompt=p)
        for label, dev, chunk in (("cpu", "cpu", 1), ("gpu_decode", "cuda", 1), ("gpu_prefill", "cuda", len(ids))):
            got = kaon_logits(path, dev, chunk, ids, V, tmp_path)
            top1, n_sel = agreement(got, exact)
            row[label] = dict(rel_err=float(np.linalg.norm(got - exact) / np.linalg.norm(exact)), top1=top1)
        row["positions"] = n_sel
        report.append(row)
    record("gguf_vs_exact", file=name, prompts=report)
    print(name, json.dumps(report))
    # Top-1 agreement (where the exact top-2 margin exceeds 0.1) over all prompts' positions.
    pooled = {k: sum(r[k]["top1"] * r["positions"] for r in report) / sum(r["positions"] for r in report)
              for k in ("cpu", "gpu_decode", "gpu_prefill")}
    print(name, "pooled top-1", pooled)
    for label in ("gpu_decode", "gpu_prefill"):
        # bf16's share on top of the CPU's own error, and a few more near-tie flips (3%: about 8
        # of 280 positions; one prompt's ~70 are too few to judge alone).
        for r in report:
            assert r[label]["rel_err"] <= 1.25 * r["cpu"]["rel_err"] + 0.01, r
        assert pooled[label] >= pooled["cpu"] - 0.03, pooled


# ---- quantized GGUF weights kept quantized on the GPU (cuda_quant.cu) ------------------------------
# n <= 64: activations quantized to 8-bit blocks of 32 exactly as the CPU backend does, integer
# GEMV (passes of 8 rows); n > 64: the weight dequantized to bf16 and cuBLASLt. The references
# follow the path: the same int8 activations times the gguf package's dequantized weights in
# float64, or bf16(weights) times bf16(x); every output is also checked against the plain
# product x @ W^T. KAON_OP_DEVICE=cpu runs the same ops on the CPU backend (a harness check).

Q_GEMV_MAX_N = 64
Q_NS = [1, 2, 3, 8, 17, 64, 100]
Q_ON_CPU = os.environ.get("KAON_OP_DEVICE") == "cpu"


def q8_act(x):
    """x [n, K] -> the CPU backend's 8-bit activations, dequantized (float64): per block of 32,
    d = max|x| / 127 (f32), q = round-half-even(x * (1 / d)) clipped to +-127."""
    n, K = x.shape
    xb = np.asarray(x, np.float32).reshape(n, K // 32, 32)
    d = (np.abs(xb).max(-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, (np.float32(1) / d).astype(np.float32), np.float32(0))
    q = np.clip(np.rint((xb * inv[..., None]).astype(np.float32)), -127, 127)
    return (q.astype(np.float64) * d[..., None].astype(np.float64)).reshape(n, K)


def q_weight(rng, qtype, rows, cols):
    """(raw GGUF block bytes [rows, row_bytes], dequantized weights float64 [rows, cols])."""
    import gguf
    if qtype == 30:  # a bf16 matrix beside the quantized ones
        w = bf16(rng.standard_normal((rows, cols)) * 0.05)
        raw = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
        return raw, w.astype(np.float64)
    raw = random_blocks(rng, qtype, rows * cols // block_of(qtype)[0]).reshape(rows, -1)
    w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)).reshape(rows, cols)
    return raw, w.astype(np.float64)


def q_ref(x, w, qtype, n):
    """The product the GPU computes for this weight format and batch size."""
    if qtype == 30:
        return x[:n].astype(np.float64) @ w.T
    if n <= Q_GEMV_MAX_N or Q_ON_CPU:
        return q8_act(x[:n]) @ w.T
    return x[:n].astype(np.float64) @ bf16(w).astype(np.float64).T


def run_qop(tmp, op, params, arrays, env=None):
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "params.txt").write_text("\n".join([f"op {op}"] + [f"{k} {v}" for k, v in params.items()]) + "\n")
    for name, a in arrays.items():
        np.ascontiguousarray(a).tofile(tmp / f"{name}.bin")
    p = subprocess.run([driver(), "op", str(tmp)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **(env or {})))
    assert p.returncode == 0, f"driver failed: {p.stderr}"
    return p.stdout


@pytest.mark.parametrize("qname,qtype", QTYPES)
@pytest.mark.parametrize("rows,cols,has_bias", [(515, 1024, 1), (37, 4096, 0), (1001, 256, 1)])
def test_quant_linear(tmp_path, qname, qtype, rows, cols, has_bias):
    rng = np.random.default_rng()
    raw, w = q_weight(rng, qtype, rows, cols)
    x = bf16(rng.standard_normal((max(Q_NS), cols)))
    b = rng.standard_normal(rows).astype(np.float32)
    run_qop(tmp_path, "qlinear", dict(type=qtype, out=rows, **{"in": cols}, ns=",".join(map(str, Q_NS)),
                                      has_bias=has_bias), dict(raw=raw, x=x, b=b))
    errs = {}
    for n in Q_NS:
        got = out(tmp_path, f"out_{n}", (n, rows))
        bb = b if has_bias else 0
        e, e_plain = rel(got, q_ref(x, w, qtype, n) + bb), rel(got, x[:n].astype(np.float64) @ w.T + bb)
        errs[n] = (e, e_plain)
        assert e < 1e-2 and e_plain < 2e-2, (qname, n, e, e_plain)
    record("quant_linear", type=qname, rows=rows, inp=cols, rel_err={n: v[0] for n, v in errs.items()},
           rel_err_vs_unquantized_x={n: v[1] for n, v in errs.items()})


@pytest.mark.parametrize("qname,qtype", [("Q4_0", 2), ("Q8_0", 8), ("Q4_K", 12), ("Q6_K", 14), ("Q5_0", 6),
                                         ("IQ4_NL", 20), ("Q3_K", 11), ("Q5_K", 13), ("IQ4_XS", 23)])
def test_quant_linear_f32_logits(tmp_path, qname, qtype):
    rng = np.random.default_rng()
    rows, cols, ns = 3001, 2048, [1, 3, 100]
    raw, w = q_weight(rng, qtype, rows, cols)
    x = bf16(rng.standard_normal((max(ns), cols)))
    run_qop(tmp_path, "qlinear", dict(type=qtype, out=rows, **{"in": cols}, ns=",".join(map(str, ns)), f32out=1),
            dict(raw=raw, x=x))
    for n in ns:
        got = out(tmp_path, f"out_{n}", (n, rows))
        e = rel(got, q_ref(x, w, qtype, n))
        record("quant_linear_f32", type=qname, n=n, rel_err=e)
        assert e < 1e-4, (qname, n, e)  # f32 logits: no bf16 rounding of the result


@pytest.mark.parametrize("types,rows,cols,has_bias", [
    ((2, 2, 2), (512, 128, 136), 1024, 1),     # q/k/v of one format
    ((12, 12, 14), (256, 64, 64), 2048, 0),    # Q4_K_M-style: v in Q6_K
    ((8, 30, 3), (300, 100, 50), 512, 1),      # a bf16 matrix among quantized ones
    ((6, 7, 20), (512, 128, 136), 1024, 1),    # the other formats in blocks of 32
    ((10, 11, 13), (256, 64, 64), 2048, 0),    # Q2_K / Q3_K / Q5_K
    ((23, 23, 14), (256, 64, 64), 2048, 1),    # IQ4_XS, v in Q6_K
])
def test_quant_linear_multi(tmp_path, types, rows, cols, has_bias):
    rng = np.random.default_rng()
    ns = [1, 5, 17, 100]
    x = bf16(rng.standard_normal((max(ns), cols)))
    arrays, params, ws = dict(x=x), dict(**{"in": cols}, ns=",".join(map(str, ns)), has_bias=has_bias), []
    for k, (t, r) in enumerate(zip(types, rows)):
        raw, w = q_weight(rng, t, r, cols)
        ws.append(w)
        arrays[f"raw{k}"], arrays[f"b{k}"] = raw, rng.standard_normal(r).astype(np.float32)
        params[f"t{k}"], params[f"out{k}"] = t, r
    rcs = json.loads(run_qop(tmp_path, "qmulti", params, arrays))
    assert Q_ON_CPU or rcs == [0] * len(ns)  # quantized weights: the fused op never declines
    for n in ns:
        for k, (t, r) in enumerate(zip(types, rows)):
            bb = arrays[f"b{k}"] if has_bias else 0
            got = out(tmp_path, f"out{k}_{n}", (n, r))
            e, e_plain = rel(got, q_ref(x, ws[k], t, n) + bb), rel(got, x[:n].astype(np.float64) @ ws[k].T + bb)
            assert e < 1e-2 and e_plain < 2e-2, (types, n, k, e, e_plain)


@pytest.mark.parametrize("tg,tu", [(2, 2), (3, 3), (8, 8), (12, 12), (14, 14), (12, 14), (6, 6), (7, 7), (20, 20),
                                   (10, 10), (11, 11), (13, 13), (23, 23), (13, 14)])
def test_quant_linear_silu_mul(tmp_path, tg, tu):
    rng = np.random.default_rng()
    rows, cols, ns = 700, 2048, [1, 2, 5, 8, 17, 100]
    (rg, wg), (ru, wu) = q_weight(rng, tg, rows, cols), q_weight(rng, tu, rows, cols)
    x = bf16(rng.standard_normal((max(ns), cols)))
    rcs = json.loads(run_qop(tmp_path, "qsilu", dict(tg=tg, tu=tu, out=rows, **{"in": cols}, ns=",".join(map(str, ns))),
                             dict(rawg=rg, rawu=ru, x=x)))
    assert Q_ON_CPU or rcs == [0] * len(ns)
    for n in ns:
        got = out(tmp_path, f"out_{n}", (n, rows))
        g, u = q_ref(x, wg, tg, n), q_ref(x, wu, tu, n)
        gp, up = x[:n].astype(np.float64) @ wg.T, x[:n].astype(np.float64) @ wu.T
        e, e_plain = rel(got, g / (1 + np.exp(-g)) * u), rel(got, gp / (1 + np.exp(-gp)) * up)
        record("quant_silu", tg=tg, tu=tu, n=n, rel_err=e, rel_err_vs_unquantized_x=e_plain)
        assert e < 1.5e-2 and e_plain < 3e-2, (tg, tu, n, e, e_plain)


def test_quant_off_expands_to_bf16(tmp_path):
    """KAON_CUDA_QUANT=0: the old path (weights expanded to bf16 at upload) still works."""
    if Q_ON_CPU:
        pytest.skip("GPU only")
    rng = np.random.default_rng()
    rows, cols, ns = 333, 1024, [1, 4, 100]
    raw, w = q_weight(rng, 12, rows, cols)
    x = bf16(rng.standard_normal((max(ns), cols)))
    run_qop(tmp_path, "qlinear", dict(type=12, out=rows, **{"in": cols}, ns=",".join(map(str, ns))),
            dict(raw=raw, x=x), env={"KAON_CUDA_QUANT": "0"})
    for n in ns:
        ref = x[:n].astype(np.float64) @ bf16(w).astype(np.float64).T
        assert rel(out(tmp_path, f"out_{n}", (n, rows)), ref) < 1e-2


# Each GGUF type in one file: Q4_0 as llama.cpp writes its Q4_0 files (Q6_K output), and a file of
# each type issue 23 added, every matrix in it (ggml type ids).
GREEDY_FILES = {"q4_0": dict(embd=2, attn=2, ffn=2, down=2, out=14),
                **{name: dict(embd=t, attn=t, ffn=t, down=t, out=t)
                   for name, t in (("q5_0", 6), ("q5_1", 7), ("q2_k", 10), ("q3_k", 11), ("q5_k", 13),
                                   ("iq4_nl", 20), ("iq4_xs", 23))}}


@pytest.mark.parametrize("name", list(GREEDY_FILES))
def test_quant_greedy_gpu_equals_cpu(tmp_path, name):
    """Greedy ids on the GPU against our CPU backend, 4 prompts x 64 tokens, on a file of one
    GGUF type. Where they part, both backends' logits of the common prefix (one token per step;
    the greedy runs took the prompt at once, so the picks are recorded, not asserted, as these
    logits' top-1) must show a near-tie: the two agree as elsewhere (relative error <= 0.1; a wrong format path gives ~1), and the CPU prefers
    its own pick by at most 3x the RMS of the two backends' logit difference at that position
    (the backends' numerical disagreement decides, not a wrong kernel). With every matrix in a
    2-5 bit type (embedding and head too) the random model's logits are flat: three-way ties
    occur, so the GPU's pick need not be the CPU's second."""
    rng = np.random.default_rng()
    shape = dict(dim=512, ffn=1536, vocab=32000, layers=8, heads=8, kv_heads=2)
    V = shape["vocab"]
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, shape, GREEDY_FILES[name], rng)
    report = []
    for p in range(4):
        prompt = rng.integers(3, V, 5 + 7 * p).tolist()
        g, c = greedy(path, "cuda", prompt, 64), greedy(path, "cpu", prompt, 64)
        f = next((i for i in range(64) if g[i][0] != c[i][0]), None)
        row = dict(prompt=p, same=f is None, first_divergence=f, same_tokens=sum(a[0] == b[0] for a, b in zip(g, c)),
                   median_cpu_margin=float(np.median([x[1] for x in c])))
        if f is not None:
            prefix = prompt + [x[0] for x in c[:f]]
            lg = kaon_logits(path, "cuda", 1, prefix, V, tmp_path)[-1].astype(np.float64)
            lc = kaon_logits(path, "cpu", 1, prefix, V, tmp_path)[-1].astype(np.float64)
            d = lg - lc
            row.update(gpu_pick_is_its_top1=int(lg.argmax()) == g[f][0], cpu_pick_is_its_top1=int(lc.argmax()) == c[f][0],
                       rel_err=float(np.linalg.norm(d) / np.linalg.norm(lc)), cpu_gap=float(lc.max() - lc[g[f][0]]),
                       rms_diff=float(np.sqrt(np.mean(d * d))))
        report.append(row)
    record("quant_gguf_greedy", file=name, prompts=report)
    print(name, json.dumps(report))
    for r in report:
        if not r["same"]:
            assert r["rel_err"] <= 0.1 and r["cpu_gap"] <= 5 * r["rms_diff"], r


@pytest.mark.parametrize("name,qtypes,arch", [("q4_0", dict(embd=2, attn=2, ffn=2, down=2, out=14), "llama"),
                                              ("kquants", dict(embd=8, attn=12, ffn=12, down=14, out=14), "llama"),
                                              ("q8_0-qwen2", dict(embd=8, attn=8, ffn=8, down=8, out=14), "qwen2")])
def test_quant_fused_norm_bit_equal(tmp_path, name, qtypes, arch):
    """The residual add in the quantized GEMV's epilogue, RMSNorm inside the activations'
    quantization (kc_quant_linear_residual, kc_quant_norm_linear_*) and, at one token a step, RoPE
    and the KV write in the q / k / v GEMV's epilogue (kc_quant_norm_qkv_rope: llama's adjacent
    pairs, qwen2's NeoX pairs and biases) give the separate ops' logits bit for bit
    (KAON_QUANT_FUSE=0), one token per step (n = 1) and in chunks of 5 (one GEMV pass of 8 rows);
    the debug log says the fused forms ran, and only when on."""
    rng = np.random.default_rng()
    shape = dict(dim=512, ffn=1536, vocab=32000, layers=4, heads=8, kv_heads=2)
    V = shape["vocab"]
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, shape, qtypes, rng, arch)
    ids = ",".join(map(str, rng.integers(3, V, 12).tolist()))
    for chunk in (1, 5):
        got = {}
        for fuse in ("1", "0"):
            o = tmp_path / f"fuse{fuse}_{chunk}.f32"
            p = subprocess.run([driver(), "logits", str(path), "cuda", str(chunk), ids, str(o)], capture_output=True,
                               text=True, timeout=600, env=dict(os.environ, KAON_QUANT_FUSE=fuse, KAON_LOG="debug"))
            assert p.returncode == 0, p.stderr
            assert ("RMSNorm fused into the quantized GEMVs" in p.stderr) == (fuse == "1"), p.stderr[-2000:]
            rope = "RoPE and the KV write fused into the quantized q / k / v GEMV" in p.stderr
            assert rope == (fuse == "1" and chunk == 1), p.stderr[-2000:]
            got[fuse] = np.fromfile(o, np.float32).reshape(-1, V)
        assert got["1"].shape == (12, V)
        assert np.array_equal(got["1"], got["0"]), (chunk, float(np.abs(got["1"] - got["0"]).max()))


@pytest.mark.parametrize("name,qtypes", [("q4_0", dict(embd=2, attn=2, ffn=2, down=2, out=14)),
                                         ("kquants", dict(embd=8, attn=12, ffn=12, down=14, out=14)),
                                         ("q5-q2k-q3k-iq4xs", dict(embd=6, attn=13, ffn=10, down=11, out=23)),
                                         ("q5_1-iq4nl-q5k", dict(embd=20, attn=7, ffn=13, down=20, out=14))])
def test_quant_gguf_logits_gpu_vs_cpu(tmp_path, name, qtypes):
    """Prefill logits of a quantized GGUF, GPU (int8 activations from bf16 ones) against our CPU
    backend (int8 from f32): how far apart they are (a wrong format path gives errors of order 1)."""
    rng = np.random.default_rng()
    shape = dict(dim=512, ffn=1536, vocab=32000, layers=8, heads=8, kv_heads=2)
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, shape, qtypes, rng)
    ids = rng.integers(3, shape["vocab"], 24).tolist()
    g = kaon_logits(path, "cuda", len(ids), ids, shape["vocab"], tmp_path)
    c = kaon_logits(path, "cpu", len(ids), ids, shape["vocab"], tmp_path)
    e = rel(g, c)
    by_pos = [rel(g[i], c[i]) for i in range(len(ids))]
    top1, n_sel = agreement(g, c)
    record("quant_gguf_logits", file=name, rel_err=e, rel_err_first_pos=by_pos[0], rel_err_last_pos=by_pos[-1],
           top1_where_margin_gt_0_1=top1, positions=n_sel)
    print(name, e, by_pos[0], by_pos[-1], top1)
    assert e < 0.2 and by_pos[0] < 0.1, (e, by_pos)
