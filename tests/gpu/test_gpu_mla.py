"""GPU tests of the ops of DeepSeek's multi-head latent attention (src/backend/cuda/cuda_mla.cu),
run on the GPU machine by tests/gpu/run_all.sh (section `mla`, about 2 minutes).

Each op through gpu_driver's op mechanism on fresh random bf16 inputs, outputs poisoned with NaN,
against a float64 numpy reference:
- copy_strided: every access width (16 B, 4 B, 2 B), a scale; what lies between the rows stays
  untouched (NaN).
- head_linear: per-head matrices on strided x and y as kaon_blk_mla uses them (W_UK^T into the
  absorbed q, W_UV out of the latent), decode batches (our kernel), prefill (cuBLASLt
  strided-batched), unaligned strides, a quantized GGUF matrix (dequantized first).
- mla_attention on the paged latent cache (kv_write without V): heads 16 / 32 / 64 / 128 with
  kv_lora 512 + rope 64 (the tensor-core kernel), tiny widths (the generic kernel, also forced on
  the real widths with KAON_MLA_GENERIC=1), decode batches, prefill with mixed lengths, scattered
  blocks with unused table entries -1, padding tokens (position and sequence -1: zeros), 4K and
  32K contexts.

With KAON_OP_DEVICE=cpu the same tests run on the CPU backend (to check the tests themselves
without a GPU).
"""
import os

import numpy as np
import pytest

from test_gpu import bf16, out, record, rel, run_op

ON_CPU = os.environ.get("KAON_OP_DEVICE") == "cpu"


def raw_out(tmp, n):
    a = np.fromfile(tmp / "out.bin", dtype=np.float32)
    assert a.size == n
    return a


# ---- copy_strided ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rows,width,ss,ds,so,do,s", [
    (37, 64, 192, 576, 128, 512, 1.0),   # q_pe into the absorbed q (16-byte accesses)
    (300, 512, 576, 512, 0, 0, 1.0),     # the latent out of [c | k_pe]
    (5, 8, 16, 8, 8, 0, 1.2345),         # 16-byte accesses with a scale
    (64, 6, 10, 14, 2, 4, 0.5),          # 4-byte accesses
    (33, 13, 17, 20, 3, 1, -2.0),        # element by element
    (1, 1, 1, 1, 0, 0, 3.0),
])
def test_copy_strided(tmp_path, rows, width, ss, ds, so, do, s):
    rng = np.random.default_rng()
    nsrc, ndst = so + rows * ss, do + rows * ds
    x = bf16(rng.standard_normal(nsrc))
    run_op(tmp_path, "copy_strided", dict(rows=rows, width=width, src_stride=ss, dst_stride=ds, src_off=so,
                                          dst_off=do, s=s), dict(x=x))
    got = raw_out(tmp_path, ndst)
    mask = np.zeros(ndst, bool)
    ref = np.full(ndst, np.nan, np.float32)
    for r in range(rows):
        src = x[so + r * ss: so + r * ss + width]
        v = np.float32(s) * src
        ref[do + r * ds: do + r * ds + width] = v if ON_CPU else bf16(v)
        mask[do + r * ds: do + r * ds + width] = True
    assert np.isnan(got[~mask]).all(), "copy_strided wrote outside its rows"
    assert np.array_equal(got[mask], ref[mask]), float(np.nanmax(np.abs(got[mask] - ref[mask])))


# ---- head_linear ----------------------------------------------------------------------------------

HL_CASES = [
    # name, n, heads, in, out, x_tok, x_head, y_tok, y_head, x_off, y_off
    ("wuk-decode-h128", 1, 128, 128, 512, 128 * 192, 192, 128 * 576, 576, 0, 0),
    ("wuk-batch5-h16", 5, 16, 128, 512, 16 * 192, 192, 16 * 576, 576, 0, 0),
    ("wuv-batch8-h16", 8, 16, 512, 128, 16 * 512, 512, 16 * 128, 128, 0, 0),
    ("wuv-batch3-h64", 3, 64, 512, 128, 64 * 512, 512, 64 * 128, 128, 0, 0),
    ("wuk-prefill-h16", 200, 16, 128, 512, 16 * 192, 192, 16 * 576, 576, 0, 0),
    ("wuv-prefill-h128", 70, 128, 512, 128, 128 * 512, 512, 128 * 128, 128, 0, 0),
    ("wuk-9-tokens-h32", 9, 32, 128, 512, 32 * 192, 192, 32 * 576, 576, 0, 0),
    ("tiny", 5, 4, 16, 32, 4 * 24, 24, 4 * 40, 40, 0, 0),
    ("tiny-prefill", 40, 4, 16, 32, 4 * 24, 24, 4 * 40, 40, 8, 0),
    ("unaligned-decode", 3, 3, 20, 12, 70, 23, 41, 13, 1, 3),
    ("unaligned-prefill", 37, 3, 20, 12, 70, 23, 41, 13, 1, 3),
]


def head_ref(x, n, nh, i, o, xt, xh, yt, yh, xo, yo, w, ny):
    ref = np.full(ny, np.nan)
    mask = np.zeros(ny, bool)
    for t in range(n):
        for h in range(nh):
            xs = x[xo + t * xt + h * xh: xo + t * xt + h * xh + i].astype(np.float64)
            ys = yo + t * yt + h * yh
            ref[ys: ys + o] = w[h * o:(h + 1) * o].astype(np.float64) @ xs
            mask[ys: ys + o] = True
    return ref, mask


@pytest.mark.parametrize("name,n,nh,i,o,xt,xh,yt,yh,xo,yo", HL_CASES)
def test_head_linear(tmp_path, name, n, nh, i, o, xt, xh, yt, yh, xo, yo):
    rng = np.random.default_rng()
    nx, ny = xo + n * xt, yo + n * yt
    x = bf16(rng.standard_normal(nx))
    w = bf16(rng.standard_normal((nh * o, i)) / np.sqrt(i))
    run_op(tmp_path, "head_linear", dict(n=n, nh=nh, **{"in": i}, out=o, x_tok=xt, x_head=xh, y_tok=yt, y_head=yh,
                                         x_off=xo, y_off=yo, reps=2), dict(x=x, w=w))
    got = raw_out(tmp_path, ny)
    ref, mask = head_ref(x, n, nh, i, o, xt, xh, yt, yh, xo, yo, w, ny)
    assert np.isnan(got[~mask]).all(), "head_linear wrote outside its heads' rows"
    e = rel(got[mask], ref[mask])
    record("head_linear", case=name, rel_err=e)
    assert e < 1e-2, e


def test_head_linear_quantized(tmp_path):
    """A Q8_0 head matrix (GGUF attn_k_b / attn_v_b may come quantized): dequantized, then the
    bf16 path (decode and prefill batch sizes)."""
    pytest.importorskip("gguf")
    from test_gpu import q_weight
    rng = np.random.default_rng()
    nh, i, o = 16, 128, 64
    raw, w = q_weight(rng, 8, nh * o, i)
    for n in (2, 40):
        d = tmp_path / f"n{n}"
        xt, xh, yt, yh = nh * 192, 192, nh * o, o
        x = bf16(rng.standard_normal(n * xt))
        run_op(d, "head_linear", dict(n=n, nh=nh, **{"in": i}, out=o, x_tok=xt, x_head=xh, y_tok=yt, y_head=yh,
                                      qtype=8), dict(x=x, raw=np.ascontiguousarray(raw)))
        got = raw_out(d, n * yt)
        ref, mask = head_ref(x, n, nh, i, o, xt, xh, yt, yh, 0, 0, w, n * yt)
        e = rel(got[mask], ref[mask])
        record("head_linear_q8_0", n=n, rel_err=e)
        assert e < 1e-2, (n, e)


# ---- mla_attention ----------------------------------------------------------------------------------

def mla_case(rng, ctx, new, nh, kvl, rd, bs, contiguous=False, npad=0, qstd=1.0):
    """Sequences with ctx[i] cached rows and new[i] query tokens, blocks scattered, table entries
    past each sequence's last block -1; npad padding tokens (position, sequence, slot -1) mixed in."""
    S, D = len(ctx), kvl + rd
    total = [c + n for c, n in zip(ctx, new)]
    mb = max((t + bs - 1) // bs for t in total) + 1
    n_blocks = S * mb + 3
    tables = rng.permutation(n_blocks)[: S * mb].astype(np.int32).reshape(S, mb)
    for s in range(S):
        tables[s, (total[s] + bs - 1) // bs:] = -1
    slot_of = lambda s, p: int(tables[s, p // bs]) * bs + p % bs
    R = [bf16(rng.standard_normal((t, D))) for t in total]
    ctx_row = np.concatenate([R[s][: ctx[s]] for s in range(S)] + [np.zeros((0, D), np.float32)])
    ctx_slot = np.array([slot_of(s, p) for s in range(S) for p in range(ctx[s])], np.int32)
    order = [(s, ctx[s] + j) for j in range(max(new)) for s in range(S) if j < new[s]]
    if contiguous:
        order = [(s, ctx[s] + j) for s in range(S) for j in range(new[s])]
    for _ in range(npad):
        order.insert(int(rng.integers(0, len(order) + 1)), (-1, -1))
    T = len(order)
    q = bf16(rng.standard_normal((T, nh, D)) * qstd)
    row = np.stack([R[s][p] if s >= 0 else np.zeros(D, np.float32) for s, p in order])
    arrays = dict(tables=tables, ctx_slot=ctx_slot, ctx_row=ctx_row, q=q, row=row,
                  pos=np.array([p for _, p in order], np.int32), seq=np.array([s for s, _ in order], np.int32),
                  slot=np.array([slot_of(s, p) if s >= 0 else -1 for s, p in order], np.int32))
    params = dict(T=T, n_seqs=S, nh=nh, kvl=kvl, rd=rd, bs=bs, n_blocks=n_blocks, max_blocks=mb,
                  n_ctx=int(sum(ctx)), scale=1 / np.sqrt(192))
    return arrays, params, order, R


def mla_ref(q, order, R, kvl, scale):
    T, nh, _ = q.shape
    outs = np.zeros((T, nh, kvl))
    for t, (s, p) in enumerate(order):
        if s < 0:
            continue
        K = R[s][: p + 1].astype(np.float64)  # [L, D]
        sc = q[t].astype(np.float64) @ K.T * scale
        w = np.exp(sc - sc.max(-1, keepdims=True))
        outs[t] = (w / w.sum(-1, keepdims=True)) @ K[:, :kvl]
    return outs


MLA_CASES = [
    # name, cached rows, new tokens (per sequence), heads, kv_lora, rope, block size, prefill
    # layout, padding tokens, env
    ("tiny-generic", [0, 5, 40], [7, 1, 3], 4, 32, 8, 16, False, 2, None),
    ("tiny-h16", [0, 70], [20, 1], 16, 32, 8, 16, True, 0, None),
    ("odd-row", [3, 0], [1, 9], 3, 16, 6, 8, False, 1, None),  # rows of 22: not whole 16-byte units
    ("h16-decode", [0, 99, 3000, 700], [1, 1, 1, 1], 16, 512, 64, 16, False, 0, None),
    ("h16-decode-pad", [200, 1500], [1, 1], 16, 512, 64, 64, False, 3, None),
    ("h32-prefix+decode", [50, 500, 0], [20, 1, 5], 32, 512, 64, 16, False, 0, None),
    ("h48-decode", [1000, 10], [1, 2], 48, 512, 64, 16, False, 0, None),
    ("h64-decode-batch", [37, 1023, 2047, 0, 300, 5, 1500, 999], [1] * 8, 64, 512, 64, 16, False, 0, None),
    ("h128-decode-4k", [4095, 100], [1, 1], 128, 512, 64, 64, False, 1, None),
    ("h128-prefill-mixed", [0, 300, 0, 2000], [70, 17, 130, 1], 128, 512, 64, 16, True, 0, None),
    ("h16-prefill-long", [0], [600], 16, 512, 64, 64, True, 0, None),
    ("h64-generic-forced", [0, 800], [9, 1], 64, 512, 64, 16, True, 1, {"KAON_MLA_GENERIC": "1"}),
    ("h16-generic-forced-decode", [3000, 17], [1, 1], 16, 512, 64, 16, False, 0, {"KAON_MLA_GENERIC": "1"}),
]


def check_mla(tmp_path, name, ctx, new, nh, kvl, rd, bs, contig, npad, env, save_cache=True):
    rng = np.random.default_rng()
    arrays, params, order, R = mla_case(rng, ctx, new, nh, kvl, rd, bs, contig, npad)
    run_op(tmp_path, "mla", dict(params, save_cache=int(save_cache)), arrays, env=env)
    ref = mla_ref(arrays["q"], order, R, kvl, params["scale"])
    got = out(tmp_path, shape=ref.shape)
    real = np.array([s >= 0 for s, _ in order])
    assert np.all(got[~real] == 0), "padding tokens must get zeros"
    e = rel(got[real], ref[real])
    d = np.linalg.norm(got[real].astype(np.float64) - ref[real], axis=-1) / np.maximum(
        np.linalg.norm(ref[real], axis=-1), 1e-30)
    record("mla_attention", case=name, rel_err=e, worst_row=float(d.max()))
    print(name, f"rel err {e:.2e}, worst row {float(d.max()):.2e}")
    assert e < 1e-2, (name, e)
    assert d.max() < 3e-2, (name, float(d.max()))
    if save_cache:  # each real token's row landed in its slot
        cache = np.fromfile(tmp_path / "out_cache.bin", np.float32).reshape(-1, kvl + rd)
        sl = arrays["slot"][real]
        assert np.array_equal(cache[sl], arrays["row"][real])


@pytest.mark.parametrize("name,ctx,new,nh,kvl,rd,bs,contig,npad,env", MLA_CASES)
def test_mla_attention(tmp_path, name, ctx, new, nh, kvl, rd, bs, contig, npad, env):
    check_mla(tmp_path, name, ctx, new, nh, kvl, rd, bs, contig, npad, env)


@pytest.mark.parametrize("name,ctx,nh,env", [
    ("h128-32k", [32767], 128, None),
    ("h16-32k+5k", [32000, 5000], 16, None),
    ("h64-32k-generic", [32767], 64, {"KAON_MLA_GENERIC": "1"}),
])
def test_mla_attention_long(tmp_path, name, ctx, nh, env):
    """4K-32K contexts: the split contexts and their merge."""
    check_mla(tmp_path, name, ctx, [1] * len(ctx), nh, 512, 64, 64, False, 0, env, save_cache=False)
