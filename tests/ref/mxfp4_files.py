"""MXFP4 checkpoints as OpenAI's gpt-oss converter writes them (FORMATS-2.md §7), in plain
numpy: a tensor `<name>` becomes `<name>_blocks` uint8 [..., rows, cols/32, 16] (byte j of a
block: element 2j in the low nibble, 2j+1 in the high one) and `<name>_scales` uint8
[..., rows, cols/32] (E8M0, 2^(s - 127)). The scale of a block is amax/6 rounded up to a power
of two (triton_kernels' downcast_to_mxfp, ROUND_UP), the values rounded to the nearest e2m1.
The dequantized tensors (exact in f32) come back for the float reference."""
import numpy as np

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def quantize(w):
    """(codes uint8 [..., R, C/32, 32] in 0..15, e8m0 uint8 [..., R, C/32]) of w [..., R, C]."""
    w = np.asarray(w, np.float64)
    b = w.reshape(w.shape[:-1] + (w.shape[-1] // 32, 32))
    amax = np.abs(b).max(-1)
    exp = np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0))
    exp = np.clip(np.where(amax > 0, exp, -127), -127, 127)
    v = b / np.exp2(exp)[..., None]
    mag = np.abs(E2M1[:8]).astype(np.float64)
    idx = np.abs(np.abs(v)[..., None] - mag).argmin(-1)  # nearest magnitude (ties: the lower)
    codes = (idx + 8 * (v < 0)).astype(np.uint8)
    return codes, (exp + 127).astype(np.uint8)


def dequantize(codes, e8m0):
    d = E2M1[codes] * np.exp2(e8m0.astype(np.float32) - 127)[..., None]
    return d.reshape(d.shape[:-2] + (-1,)).astype(np.float32)


def pack(codes, swap=False):
    """Two codes a byte, element 2j low (swap: high, the wrong order for the negative check)."""
    lo, hi = codes[..., 0::2], codes[..., 1::2]
    if swap:
        lo, hi = hi, lo
    return (lo | hi << 4).astype(np.uint8)


def quantize_checkpoint(weights, quantized, not_convert=(), swap=False):
    """(quantization_config, tensors to write, dequantized float weights) of weights, the names
    for which quantized(name) holds stored as `<name>_blocks` / `<name>_scales` (U8)."""
    files, deq = {}, {}
    for name, w in weights.items():
        if not quantized(name):
            files[name] = deq[name] = w
            continue
        codes, e = quantize(w)
        files[name + "_blocks"] = ("U8", pack(codes, swap))
        files[name + "_scales"] = ("U8", e)
        deq[name] = dequantize(codes, e)
    qc = {"quant_method": "mxfp4", "modules_to_not_convert": list(not_convert)}
    return qc, files, deq
