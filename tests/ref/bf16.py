"""bfloat16 rounding (round to nearest, ties to even), as the tiny checkpoints store BF16 weights
and as the references round values a bf16 model computes with."""
import numpy as np


def to_bf16_bits(a):
    """Round-to-nearest-even f32 -> bf16 bit patterns (uint16)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_bits_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def round_bf16(w, keep_f32=()):
    """The values a BF16 checkpoint stores for weights w {name: array}: each rounded to bf16,
    except the tensors whose names end with one of keep_f32 (stored in F32)."""
    keep_f32 = tuple(keep_f32)
    return {k: v if k.endswith(keep_f32) else bf16_bits_to_f32(to_bf16_bits(v)) for k, v in w.items()}


def bf16_round(x):
    """x rounded to bf16, returned as float64 (same shape; a scalar gives a 0-d array)."""
    return bf16_bits_to_f32(to_bf16_bits(x)).astype(np.float64).reshape(np.shape(x))
