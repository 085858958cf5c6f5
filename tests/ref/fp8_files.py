"""FP8 block-quantized checkpoints as DeepSeek-V3's release lays them out (FORMATS-2.md §4):
each quantized Linear's `weight` is float8_e4m3fn [out, in] and `weight_scale_inv` float32
[ceil(out/128), ceil(in/128)] with W ~ e4m3(W / s) * s, s = amax(block) / 448. Plain numpy
(no torch): e4m3 codes by nearest value, ties to the even code."""
import numpy as np

BLOCK = 128
E4M3_MAX = 448.0


def e4m3_table():
    """The value of each of the 256 e4m3fn codes (NaN for S.1111.111)."""
    b = np.arange(256)
    e, f = (b >> 3) & 15, b & 7
    v = np.where(e == 0, np.ldexp(f.astype(np.float64), -9), np.ldexp((8 + f).astype(np.float64), e - 10))
    v = np.where((e == 15) & (f == 7), np.nan, v)
    return np.where(b & 0x80, -v, v).astype(np.float32)


E4M3 = e4m3_table()
_POS = E4M3[:127].astype(np.float64)  # codes 0..126: 0 .. 448, increasing


def to_e4m3(x):
    """uint8 e4m3fn codes of x (|x| <= 448), rounded to the nearest value, ties to even."""
    a = np.minimum(np.abs(np.asarray(x, np.float64)), E4M3_MAX)
    hi = np.clip(np.searchsorted(_POS, a), 1, 126)
    lo = hi - 1
    dlo, dhi = a - _POS[lo], _POS[hi] - a
    code = np.where((dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0)), hi, lo)
    return (code | np.where(np.asarray(x) < 0, 0x80, 0)).astype(np.uint8)


def quantize_block(w, block=BLOCK):
    """(codes uint8 [out, in], scale f32 [ceil(out/b), ceil(in/b)]) of weight w."""
    w = np.asarray(w, np.float32)
    o, i = w.shape
    ro, ri = -(-o // block), -(-i // block)
    s = np.zeros((ro, ri), np.float32)
    codes = np.zeros((o, i), np.uint8)
    for r in range(ro):
        for c in range(ri):
            blk = w[r * block:(r + 1) * block, c * block:(c + 1) * block]
            s[r, c] = max(float(np.abs(blk).max()), 1e-12) / E4M3_MAX
            codes[r * block:(r + 1) * block, c * block:(c + 1) * block] = to_e4m3(blk / s[r, c])
    return codes, s


def dequantize_block(codes, s, block=BLOCK):
    """f32 W = e4m3(codes) * s, formed in f32 as kaon forms it."""
    full = np.repeat(np.repeat(s, block, 0), block, 1)[:codes.shape[0], :codes.shape[1]]
    return (E4M3[codes] * full).astype(np.float32)


def quantize_checkpoint(weights, skip=lambda name: False, block=BLOCK):
    """(file tensors, dequantized weights): every 2-D `.weight` except embeddings and skipped
    ones becomes F8_E4M3 + weight_scale_inv; the rest is returned as given."""
    files, deq = {}, {}
    for name, w in weights.items():
        if w.ndim == 2 and name.endswith(".weight") and "embed_tokens" not in name and not skip(name):
            codes, s = quantize_block(w, block)
            files[name] = ("F8_E4M3", codes)
            files[name[:-len("weight")] + "weight_scale_inv"] = ("F32", s)
            deq[name] = dequantize_block(codes, s, block)
        else:
            files[name] = w
            deq[name] = w
    return files, deq


def act_quant(x, group=BLOCK):
    """DeepSeek's dynamic activation quantization, in f32 as kaon does it (KAON_FP8_ACT=1):
    per token and group of columns, s = max(|x|, 1e-4) / 448, x ~ e4m3(x / s) * s."""
    x = np.asarray(x, np.float32)
    out = np.empty_like(x)
    for k0 in range(0, x.shape[-1], group):
        g = x[..., k0:k0 + group]
        s = (np.maximum(np.abs(g).max(-1, keepdims=True), np.float32(1e-4)) / np.float32(E4M3_MAX)).astype(np.float32)
        out[..., k0:k0 + group] = E4M3[to_e4m3((g / s).astype(np.float32))] * s
    return out


class ActQuantWeight(np.ndarray):
    """A dequantized weight whose products `h @ w.T` quantize h first, as DeepSeek's fp8_gemm
    sees its input: put in a reference model's weights after it is built."""

    def __rmatmul__(self, other):
        return act_quant(other).astype(np.float64) @ np.asarray(self)
