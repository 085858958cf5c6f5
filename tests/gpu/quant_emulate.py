#!/usr/bin/env python3
"""CPU check of cuda_quant.cu's index and bit math (no GPU needed): a numpy transcription of
its kernels, run on random GGUF blocks and compared with the `gguf` package.

  python3 tests/gpu/quant_emulate.py

For every format it emulates, step by step as the CUDA code does:
  - k_qrepack: the GGUF blocks split into the 16-byte aligned main region and the aux region;
  - k_qact: the activation rows quantized to 8-bit blocks (d, s = d * sum, the 16-value sums);
  - k_qgemv: per output row and per unit u (the loads at the kernel's byte offsets, prep's
    nibble / 6-bit-scale / Q6_K bit unpacking, loadx, and dot with __dp4a emulated);
  - k_qdequant's Deq<F>::run (the embedding and large-batch path) for every block of 32,
and checks: dequantized values == gguf.quants.dequantize exactly; the emulated GEMV equals
(gguf-dequantized W) @ (quantized x)^T in float64 to 1e-6 relative (s = d * sum is an f32, as
on the CPU; a wrong index or bit gives errors of order 1); the quantized activations equal
those of the CPU backend's reference quantizer (cpu_scalar.c, transcribed).

It covers the first five formats. All twelve (Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS
besides these) are checked by tests/unit/test_cuda_quant_host.cu, which runs the formats'
device code itself (cuda_quant_formats.cuh is __host__ __device__) on the CPU.
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_gpu import random_blocks  # noqa: E402  (the GPU tests' own block generator)

FMT = {  # type: (BLK, QB, AB, UE, GGUF block bytes, repack (qoff, qlen, aoff, alen) or None)
    2: (32, 16, 2, 32, 18, (2, 16, 0, 2)),
    3: (32, 16, 4, 32, 20, (4, 16, 0, 4)),
    8: (32, 32, 2, 32, 34, (2, 32, 0, 2)),
    12: (256, 144, 0, 64, 144, None),
    14: (256, 208, 2, 128, 210, (0, 208, 208, 2)),
}
NAMES = {2: "Q4_0", 3: "Q4_1", 8: "Q8_0", 12: "Q4_K", 14: "Q6_K"}


def f16(u16):
    return np.asarray(u16, np.uint16).view(np.float16).astype(np.float32)


# ---- k_qrepack + q_layout --------------------------------------------------------------------

def repack(raw, t, rows, cols):
    BLK, QB, AB, UE, BB, rp = FMT[t]
    nblk = rows * (cols // BLK)
    flat = raw.reshape(nblk, BB)
    main_bytes = nblk * QB
    aux_off = (main_bytes + 255) & ~255
    buf = np.zeros(aux_off + nblk * AB + (256 if AB == 0 else 0), np.uint8)
    if rp is None:  # Q4_K: as it comes
        buf[:main_bytes] = flat.reshape(-1)
    elif t == 14:  # k_qrepack_q6k: thread per super-block g, the row's unit-major planes
        nsb = cols // 256
        upr, plane = 2 * nsb, 2 * nsb * 16
        for g in range(nblk):
            s = flat[g]
            row, i = g // nsb, g % nsb
            rb = row * nsb * 208
            for hh in range(2):
                u = 2 * i + hh
                for j in range(6):
                    fr = 64 * hh + 16 * j if j < 4 else 128 + 32 * hh + 16 * (j - 4)
                    to = rb + j * plane + u * 16
                    buf[to:to + 16] = s[fr:fr + 16]
                buf[rb + 6 * plane + u * 8:rb + 6 * plane + u * 8 + 8] = s[192 + 8 * hh:200 + 8 * hh]
            buf[aux_off + 2 * g:aux_off + 2 * g + 2] = s[208:210]
    else:
        qoff, qlen, aoff, alen = rp
        assert qlen == QB and alen == AB
        buf[:main_bytes] = flat[:, qoff:qoff + qlen].reshape(-1)
        buf[aux_off:aux_off + nblk * AB] = flat[:, aoff:aoff + alen].reshape(-1)
    main = buf[:main_bytes].reshape(rows, (cols // BLK) * QB)    # row r at main + r * qrb
    aux = buf[aux_off:aux_off + nblk * AB].reshape(rows, (cols // BLK) * AB)
    return main, aux


def gather(region, off, nbytes):
    """Bytes [off, off + nbytes) of each row: region [rows, *], off [rows, U] -> [rows, U, nbytes]."""
    r = np.arange(region.shape[0])[:, None, None]
    return region[r, off[:, :, None] + np.arange(nbytes)[None, None, :]]


def words(b):
    """Little-endian int32 words of [..., 4k] bytes -> [..., k] (a 16-byte load = int4 .x .y .z .w)."""
    return np.ascontiguousarray(b).view("<i4")


def u32(x):
    return np.asarray(x).astype(np.int64) & 0xFFFFFFFF


def dp4a(a, b):
    """__dp4a(a, b, 0) over int32 arrays: sum of the 4 signed byte products."""
    a8 = np.ascontiguousarray(np.asarray(a, np.int32)).view(np.int8).reshape(*np.shape(a), 4).astype(np.int64)
    b8 = np.ascontiguousarray(np.asarray(b, np.int32)).view(np.int8).reshape(*np.shape(b), 4).astype(np.int64)
    return (a8 * b8).sum(-1)


def lo4(v):
    return (u32(v) & 0x0F0F0F0F).astype(np.uint32).view(np.int32)


def hi4(v):
    return ((u32(v) >> 4) & 0x0F0F0F0F).astype(np.uint32).view(np.int32)


# ---- k_qact (and cpu_scalar.c's kaon_cpu_quantize_row_ref) ------------------------------------

def quantize_act(x):
    """x [n, K] float32 -> xq int8 [n, K], xds float32 [n, K/32, 2], xsum int32 [n, K/32] as k_qact."""
    n, K = x.shape
    xb = x.reshape(n, K // 32, 32).astype(np.float32)
    # four lanes of 8: max over each lane's 8, then two xor-shuffles: the same max
    amax = np.abs(xb).max(-1)
    d = (amax / np.float32(127.0)).astype(np.float32)           # __fdiv_rn
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, (np.float32(1.0) / d).astype(np.float32), np.float32(0))  # __frcp_rn
    r = np.rint((xb * idv[..., None]).astype(np.float32))         # __fmul_rn, rintf (half to even)
    q = np.clip(r, -127, 127).astype(np.int8)
    qi = q.astype(np.int32)
    s01 = qi[..., :16].sum(-1)
    tot = qi.sum(-1)
    xds = np.stack([d, (d * tot.astype(np.float32)).astype(np.float32)], -1)
    xsum = ((s01 & 0xFFFF) | ((tot - s01) << 16)).astype(np.int64)
    xsum = ((xsum + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)
    return q.reshape(n, K), xds, xsum


def act_unit_major(xq, xds, xsum, bpu):
    """k_qact's stores: the natural quantized rows rearranged unit-major for units of bpu blocks,
    address by address as the kernel computes them (g = flat block, part = lane of 4)."""
    n, K = xq.shape
    nb32 = K // 32
    q_um = np.zeros(n * K, np.int8)
    ds_um = np.zeros((n * nb32, 2), np.float32)
    sum_um = np.zeros(n * nb32, np.int32)
    qflat = xq.reshape(-1)
    for g in range(n * nb32):
        r, b = g // nb32, g % nb32
        upr, u, k = nb32 // bpu, b // bpu, b % bpu
        xr = r * nb32 * 32
        for part in range(4):
            dst = xr + ((2 * k + (part >> 1)) * upr + u) * 16 + 8 * (part & 1)
            q_um[dst:dst + 8] = qflat[g * 32 + part * 8:g * 32 + part * 8 + 8]
        m = r * nb32 + k * upr + u
        ds_um[m] = xds.reshape(-1, 2)[g]
        sum_um[m] = xsum.reshape(-1)[g]
    return q_um.reshape(n, K), ds_um.reshape(n, nb32, 2), sum_um.reshape(n, nb32)


def quantize_act_cpu(x):
    """cpu_scalar.c kaon_cpu_quantize_row_ref, element by element (natural layout)."""
    n, K = x.shape
    q = np.zeros((n, K), np.int8)
    d = np.zeros((n, K // 32), np.float32)
    for r in range(n):
        for b in range(K // 32):
            xb = x[r, 32 * b:32 * b + 32].astype(np.float32)
            amax = np.float32(0)
            for e in range(32):
                v = np.float32(abs(xb[e]))
                amax = v if v > amax else amax
            db = np.float32(amax / np.float32(127.0))
            idv = np.float32(np.float32(1.0) / db) if db != 0 else np.float32(0)
            for e in range(32):
                v = np.float32(np.rint(np.float32(xb[e] * idv)))
                v = min(max(v, np.float32(-127)), np.float32(127))
                q[r, 32 * b + e] = int(v)
            d[r, b] = db
    return q, d


# ---- k_qgemv per format ------------------------------------------------------------------------

BPU = {2: 1, 3: 1, 8: 1, 12: 2, 14: 4}


def gemv_emul(t, main, aux, rows, K, xq, xds, xsum):
    """y [n, rows] float64: sum over units u of F::dot(F::prep(F::load(row, u)), F::loadx(x, u)).
    xq, xds, xsum: the natural quantized rows; loadx reads them unit-major as k_qact stores them."""
    BLK, QB, AB, UE = FMT[t][:4]
    upr = K // UE
    n = xq.shape[0]
    U = np.broadcast_to(np.arange(upr)[None, :], (rows, upr))
    q_um, ds_um, sum_um = act_unit_major(xq, xds, xsum, BPU[t])
    y = np.zeros((n, rows))
    for b in range(n):
        xb = words(q_um[b])  # int32 words of the row

        def xchunk(j, u):  # XRow xchunk: 16 bytes at (j * upr + u) * 16 -> 4 ints
            base = (j * upr + np.asarray(u)) * 4
            return xb[base[..., None] + np.arange(4)]
        ds_r = ds_um[b].astype(np.float64)
        sum_r = sum_um[b]
        uu = np.arange(upr)
        if t in (2, 3, 8):
            qb = 16 if t != 8 else 32
            q = words(gather(main, U * qb, qb))                      # ld_w16 at qr + u * QB
            if t == 2:
                d = f16(words(np.concatenate([gather(aux, U * 2, 2), np.zeros((rows, upr, 2), np.uint8)], -1))[..., 0] & 0xFFFF).astype(np.float64)
            elif t == 3:
                dm = u32(words(gather(aux, U * 4, 4))[..., 0])
                d = f16(dm & 0xFFFF).astype(np.float64)
                m = f16(dm >> 16).astype(np.float64)
            else:
                d = f16(words(np.concatenate([gather(aux, U * 2, 2), np.zeros((rows, upr, 2), np.uint8)], -1))[..., 0] & 0xFFFF).astype(np.float64)
            xa = xchunk(0, uu)[None]   # loadx: a = chunk 0 (values 0..15 of block u), b = chunk 1
            xb_ = xchunk(1, uu)[None]
            ds = ds_r[uu]
            if t == 8:
                isum = dp4a(q[..., :4], np.broadcast_to(xa, q[..., :4].shape)).sum(-1) + \
                    dp4a(q[..., 4:], np.broadcast_to(xb_, q[..., 4:].shape)).sum(-1)
                y[b] = (d * (ds[None, :, 0] * isum)).sum(-1)
            else:
                isum = dp4a(lo4(q), np.broadcast_to(xa, q.shape)).sum(-1) + \
                    dp4a(hi4(q), np.broadcast_to(xb_, q.shape)).sum(-1)
                if t == 2:
                    y[b] = (d * (ds[None, :, 0] * isum - 8.0 * ds[None, :, 1])).sum(-1)
                else:
                    y[b] = (d * (ds[None, :, 0] * isum) + m * ds[None, :, 1]).sum(-1)
        elif t == 12:
            blk = (U >> 2) * 144
            h = u32(words(gather(main, blk, 16)))                      # header: d, dmin, scales[12]
            qa = words(gather(main, blk + 16 + 32 * (U & 3), 16))
            qbb = words(gather(main, blk + 16 + 32 * (U & 3) + 16, 16))
            qq = np.concatenate([qa, qbb], -1)                         # 8 ints: qs[32p .. 32p+31]
            p4 = U & 3
            sh = 16 * (p4 & 1)
            Y, Z, V = h[..., 1] >> sh, h[..., 2] >> sh, h[..., 3] >> sh
            lowp = p4 < 2
            sc0 = np.where(lowp, Y & 63, (V & 0xF) | (((Y >> 6) & 3) << 4))
            sc1 = np.where(lowp, (Y >> 8) & 63, ((V >> 8) & 0xF) | (((Y >> 14) & 3) << 4))
            m0 = np.where(lowp, Z & 63, ((V >> 4) & 0xF) | (((Z >> 6) & 3) << 4))
            m1 = np.where(lowp, (Z >> 8) & 63, ((V >> 12) & 0xF) | (((Z >> 14) & 3) << 4))
            d = f16(h[..., 0] & 0xFFFF).astype(np.float64)
            dmin = f16(h[..., 0] >> 16).astype(np.float64)
            x0 = np.concatenate([xchunk(0, uu), xchunk(1, uu)], -1)[None]   # block 2u: chunks 0, 1
            x1 = np.concatenate([xchunk(2, uu), xchunk(3, uu)], -1)[None]   # block 2u+1: chunks 2, 3
            s0 = dp4a(lo4(qq), np.broadcast_to(x0, qq.shape)).sum(-1)
            s1 = dp4a(hi4(qq), np.broadcast_to(x1, qq.shape)).sum(-1)
            ds0, ds1 = ds_r[uu][None], ds_r[upr + uu][None]
            y[b] = ((d * sc0) * (ds0[..., 0] * s0) - (dmin * m0) * ds0[..., 1] +
                    (d * sc1) * (ds1[..., 0] * s1) - (dmin * m1) * ds1[..., 1]).sum(-1)
        elif t == 14:
            plane = upr * 16                                           # unit-major planes
            A = [words(gather(main, U * 16 + c * plane, 16)) for c in (0, 1)]        # a0, a1
            B = [words(gather(main, U * 16 + (2 + c) * plane, 16)) for c in (0, 1)]  # b0, b1
            H = [words(gather(main, U * 16 + (4 + c) * plane, 16)) for c in (0, 1)]  # h0, h1
            sc8 = gather(main, 6 * plane + U * 8, 8).view(np.int8).astype(np.int64)  # [rows, upr, 8]
            d = f16(words(np.concatenate([gather(aux, (U >> 1) * 2, 2), np.zeros((rows, upr, 2), np.uint8)], -1))[..., 0] & 0xFFFF).astype(np.float64)
            acc = np.zeros((rows, upr))
            for k in range(4):
                isum = 0
                for c in range(2):
                    a_, b_, h_ = u32(A[c]), u32(B[c]), u32(H[c])
                    qk = [(a_ & 0x0F0F0F0F) | ((h_ & 0x03030303) << 4),
                          (b_ & 0x0F0F0F0F) | (((h_ >> 2) & 0x03030303) << 4),
                          ((a_ >> 4) & 0x0F0F0F0F) | (((h_ >> 4) & 0x03030303) << 4),
                          ((b_ >> 4) & 0x0F0F0F0F) | (((h_ >> 6) & 0x03030303) << 4)][k]
                    qk = qk.astype(np.uint32).view(np.int32)
                    xv = np.broadcast_to(xchunk(2 * k + c, uu)[None], qk.shape)  # block 4u + k, half c
                    tdot = dp4a(qk, xv).sum(-1)
                    sm = np.broadcast_to(sum_r[k * upr + uu][None], (rows, upr))
                    half = (sm.astype(np.int64) << 48 >> 48) if c == 0 else (sm.astype(np.int64) >> 16)
                    isum = isum + sc8[..., 2 * k + c] * (tdot - 32 * half)
                acc += d * (ds_r[k * upr + uu][None, :, 0] * isum)
            y[b] = acc.sum(-1)
    return y


# ---- Deq<F>::run -------------------------------------------------------------------------------

def deq_emul(t, main, aux, rows, K):
    out = np.zeros((rows, K), np.float32)
    for j in range(K // 32):
        l = np.arange(32)
        if t in (2, 3):
            q = main[:, 16 * j:16 * j + 16]
            qq = np.concatenate([q & 0xF, q >> 4], 1).astype(np.int32)
            if t == 2:
                d = f16(aux[:, 2 * j].astype(np.uint16) | (aux[:, 2 * j + 1].astype(np.uint16) << 8))
                v = (qq - 8).astype(np.float32) * d[:, None]
            else:
                d = f16(aux[:, 4 * j].astype(np.uint16) | (aux[:, 4 * j + 1].astype(np.uint16) << 8))
                m = f16(aux[:, 4 * j + 2].astype(np.uint16) | (aux[:, 4 * j + 3].astype(np.uint16) << 8))
                v = qq.astype(np.float32) * d[:, None] + m[:, None]
        elif t == 8:
            q = main[:, 32 * j:32 * j + 32].view(np.int8).astype(np.float32)
            d = f16(aux[:, 2 * j].astype(np.uint16) | (aux[:, 2 * j + 1].astype(np.uint16) << 8))
            v = q * d[:, None]
        elif t == 12:
            p = (j >> 3) * 144
            sb = j & 7
            d = f16(main[:, p].astype(np.uint16) | (main[:, p + 1].astype(np.uint16) << 8))
            dmin = f16(main[:, p + 2].astype(np.uint16) | (main[:, p + 3].astype(np.uint16) << 8))
            sc = main[:, p + 4:p + 16].astype(np.int32)
            if sb < 4:
                s, m = sc[:, sb] & 63, sc[:, sb + 4] & 63
            else:
                s = (sc[:, sb + 4] & 0xF) | ((sc[:, sb - 4] >> 6) << 4)
                m = (sc[:, sb + 4] >> 4) | ((sc[:, sb] >> 6) << 4)
            q = main[:, p + 16 + (sb >> 1) * 32:p + 16 + (sb >> 1) * 32 + 32].astype(np.int32)
            q = (q >> 4) if sb & 1 else (q & 0xF)
            ds = (d * s.astype(np.float32)).astype(np.float32)
            dm = (dmin * m.astype(np.float32)).astype(np.float32)
            v = ds[:, None] * q.astype(np.float32) - dm[:, None]
        else:  # Deq<FQ6_K>: unit u = 2 (j / 8) + c / 4, k = c % 4, the unit-major planes
            upr = K // 128
            plane = upr * 16
            c = j & 7
            u, k = 2 * (j >> 3) + (c >> 2), c & 3
            o = u * 16 + (l & 15)
            half = l >> 4
            qla = main[:, half * plane + o].astype(np.int32)
            qlb = main[:, (2 + half) * plane + o].astype(np.int32)
            qh = main[:, (4 + half) * plane + o].astype(np.int32)
            sc = main[:, 6 * plane + u * 8:6 * plane + u * 8 + 8].view(np.int8).astype(np.float32)
            d = f16(aux[:, 2 * (j >> 3)].astype(np.uint16) | (aux[:, 2 * (j >> 3) + 1].astype(np.uint16) << 8))
            if k == 0:
                q = (qla & 0xF) | ((qh & 3) << 4)
            elif k == 1:
                q = (qlb & 0xF) | (((qh >> 2) & 3) << 4)
            elif k == 2:
                q = (qla >> 4) | (((qh >> 4) & 3) << 4)
            else:
                q = (qlb >> 4) | (((qh >> 6) & 3) << 4)
            v = (d[:, None] * sc[:, 2 * k + (l >> 4)]) * (q - 32).astype(np.float32)
        out[:, 32 * j:32 * j + 32] = v
    return out


def main():
    import gguf
    rng = np.random.default_rng(1)
    ok = True
    # the activation quantizer against the CPU's reference, including ties and zero blocks
    x = (rng.standard_normal((3, 256)) * 2).astype(np.float32)
    x[1, :32] = 0
    x[2, 32:64] = np.arange(32) - 15.5  # many exact halves after scaling
    q, xds, xsum = quantize_act(x)
    qc, dc = quantize_act_cpu(x)
    same = np.array_equal(q, qc) and np.array_equal(xds[..., 0], dc)
    print(f"activation quantization == cpu_scalar.c reference: {same}")
    ok &= same
    for t in (2, 3, 8, 12, 14):
        for rows, cols, n in [(37, 1024, 3), (5, 256, 2), (11, 2304, 1)]:
            BLK = FMT[t][0]
            if cols % BLK:
                continue
            raw = random_blocks(rng, t, rows * cols // BLK)
            ref_w = gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType(t)).reshape(rows, cols)
            main_r, aux_r = repack(raw, t, rows, cols)
            deq = deq_emul(t, main_r, aux_r, rows, cols)
            exact = np.array_equal(deq, ref_w.astype(np.float32))
            maxd = float(np.abs(deq - ref_w).max())
            x = (rng.standard_normal((n, cols))).astype(np.float32)
            xq, xds, xsum = quantize_act(x)
            xdeq = xq.astype(np.float64).reshape(n, cols // 32, 32) * xds[..., :1].astype(np.float64)
            ref = xdeq.reshape(n, cols) @ ref_w.astype(np.float64).T
            got = gemv_emul(t, main_r, aux_r, rows, cols, xq, xds, xsum)
            e = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            e_unq = np.linalg.norm(got - x.astype(np.float64) @ ref_w.astype(np.float64).T) / np.linalg.norm(ref)
            good = exact and e < 1e-6  # (s = d * sum is rounded to f32, as on the CPU)
            ok &= good
            print(f"{NAMES[t]:5s} {rows:3d}x{cols:4d} n={n}: dequant == gguf: {exact} (max diff {maxd:.2e}); "
                  f"gemv vs float64 ref of the same int8 activations: {e:.2e}; vs unquantized x: {e_unq:.2e}"
                  f"{'' if good else '   <-- FAIL'}")
    print("ALL OK" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
