"""Numpy building blocks of the float64 reference forward passes (gemma3_ref.py,
deepseek_ref.py): RMSNorm, RoPE (NeoX halves or interleaved pairs) and a masked softmax."""
import numpy as np


def rmsnorm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w over the last axis (Gemma's 1 + w is the caller's)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, inv, att=1.0, interleaved=False):
    """x [T, ..., d]: rotate pairs (2i, 2i+1) (interleaved) or (i, i + d/2) (NeoX, HF's
    rotate_half) by pos * inv_i; cos and sin carry the attention factor att (YaRN's). The
    output keeps x's layout."""
    ang = pos.astype(np.float64)[:, None] * inv[None, :]
    shape = (len(pos),) + (1,) * (x.ndim - 2) + (inv.size,)
    cos, sin = (np.cos(ang) * att).reshape(shape), (np.sin(ang) * att).reshape(shape)
    out = np.empty_like(x)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
    else:
        h = x.shape[-1] // 2
        a, b = x[..., :h], x[..., h:]
        out[..., :h], out[..., h:] = a * cos - b * sin, b * cos + a * sin
    return out


def softmax(x, masked=None):
    """Softmax over the last axis; where masked (broadcast against x) is true, probability 0."""
    if masked is not None:
        x = np.where(masked, -np.inf, x)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
