"""4-bit weight-only checkpoints written as their producers write them (FORMATS-2.md §5-6), in
plain numpy: AWQ gemm (AutoAWQ), GPTQ v1/v2 with optional act-order (AutoGPTQ), and
compressed-tensors pack-quantized (llm-compressor). Each quantized Linear's `weight` is
replaced by the producer's tensors; the dequantized weights ((q - z) * s in f32, s as stored)
come back beside them for the float reference."""
import numpy as np

from bf16 import bf16_bits_to_f32, to_bf16_bits

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i of an AWQ word holds column AWQ_ORDER[i] of its 8


def quantize(w, g_idx, n_groups, sym, scale_dtype):
    """(q uint8 [N, K] in 0..15, s f32 [N, G] as stored, z int [N, G]) of w [N, K], the group of
    column k being g_idx[k]. Symmetric: zero 8, s = amax / 7.5; else min/max over 15 steps."""
    N, K = w.shape
    s = np.zeros((N, n_groups), np.float32)
    z = np.full((N, n_groups), 8, np.int64)
    for g in range(n_groups):
        blk = w[:, g_idx == g].astype(np.float64)
        if sym:
            s[:, g] = np.abs(blk).max(1) / 7.5
        else:
            lo, hi = np.minimum(blk.min(1), 0), np.maximum(blk.max(1), 0)
            s[:, g] = (hi - lo) / 15
            # 1..15: GPTQ v1 stores zero - 1, and AutoGPTQ's packing corrupts a stored -1.
            z[:, g] = np.clip(np.round(-lo / s[:, g]), 1, 15)
    s = store_scales(s, scale_dtype)
    q = np.clip(np.round(w / s[:, g_idx]) + z[:, g_idx], 0, 15).astype(np.uint8)
    return q, s, z


def store_scales(s, dtype):
    if dtype == "F16":
        return s.astype(np.float16).astype(np.float32)
    return bf16_bits_to_f32(to_bf16_bits(s))


def scale_tensor(s, dtype):
    return ("F16", s.astype(np.float16)) if dtype == "F16" else ("BF16", to_bf16_bits(s))


def dequantize(q, s, z, g_idx):
    """f32 (q - z) * s, formed in f32 as kaon forms it."""
    return ((q.astype(np.float32) - z[:, g_idx].astype(np.float32)) * s[:, g_idx]).astype(np.float32)


def pack_rows(v, order=range(8)):
    """int32 words of 8 nibbles along the last axis: nibble i of word c holds v[..., 8c + order[i]]."""
    v = np.asarray(v, np.uint32)
    out = np.zeros(v.shape[:-1] + (v.shape[-1] // 8,), np.uint32)
    for i, c in enumerate(order):
        out |= (v[..., c::8] & 15) << np.uint32(4 * i)
    return out.view(np.int32)


def awq_tensors(q, s, z, order=AWQ_ORDER):
    """AutoAWQ gemm: qweight [K, N/8], qzeros [K/G, N/8] with AWQ_ORDER, scales f16 [K/G, N]."""
    return {"qweight": ("I32", pack_rows(q.T, order)), "qzeros": ("I32", pack_rows(z.T, order)),
            "scales": scale_tensor(s.T, "F16")}


def gptq_tensors(q, s, z, g_idx, v1=True):
    """AutoGPTQ: qweight [K/8, N] packed along K, qzeros [G, N/8] (v1: zero - 1), scales f16
    [G, N], g_idx int32 [K]."""
    return {"qweight": ("I32", np.ascontiguousarray(pack_rows(q).T)),
            "qzeros": ("I32", pack_rows(z.T - (1 if v1 else 0))), "scales": scale_tensor(s.T, "F16"),
            "g_idx": ("I32", g_idx.astype(np.int32))}


def ct_tensors(q, s, z, sym, g_idx=None, shape_dtype=np.int64):
    """compressed-tensors pack-quantized: weight_packed [N, K/8] (stored q + 8 = our unsigned q),
    weight_scale bf16 [N, G], weight_zero_point [N/8, G] packed along N (asymmetric only),
    weight_shape [2]."""
    t = {"weight_packed": ("I32", pack_rows(q)), "weight_scale": scale_tensor(s, "BF16"),
         "weight_shape": ("I64" if shape_dtype == np.int64 else "I32", np.array(q.shape, shape_dtype))}
    if not sym:
        t["weight_zero_point"] = ("I32", np.ascontiguousarray(pack_rows(z.T).T))
    if g_idx is not None:  # actorder: the group of each input column
        t["weight_g_idx"] = ("I32", g_idx.astype(np.int32))
    return t


FORMATS = {
    # name: (quantization_config, group size, symmetric, act-order)
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}, 32, False, False),
    "gptq_sym": ({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True}, 32, True, False),
    "gptq_asym": ({"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": False, "sym": False,
                   "checkpoint_format": "gptq"}, 64, False, False),
    "gptq_v2_asym": ({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": False,
                      "checkpoint_format": "gptq_v2"}, 32, False, False),
    "gptq_act_order": ({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False}, 32,
                       False, True),
    "ct_sym": (None, 32, True, False),
    "ct_asym": (None, 32, False, False),
    "ct_act_order": (None, 32, True, True),
}


def ct_config(sym, group, actorder=None):
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "config_groups": {"group_0": {
                "targets": ["Linear"], "input_activations": None, "output_activations": None,
                "weights": {"num_bits": 4, "type": "int", "symmetric": sym, "strategy": "group",
                            "group_size": group, "dynamic": False, "actorder": actorder, "observer": "minmax"}}}}


def quantize_checkpoint(weights, fmt, seed=0, skip=lambda name: False, awq_order=AWQ_ORDER):
    """(quantization_config, file tensors, dequantized weights) of weights {name: f32 array} in
    format fmt (a FORMATS key): every 2-D `.weight` but embeddings, lm_head and skipped ones."""
    qc, gs, sym, act_order = FORMATS[fmt]
    if qc is None:
        qc = ct_config(sym, gs, "group" if act_order else None)
    rng = np.random.default_rng(seed)
    files, deq = {}, {}
    for name, w in weights.items():
        if w.ndim != 2 or not name.endswith(".weight") or "embed_tokens" in name or "lm_head" in name or skip(name):
            files[name], deq[name] = w, w
            continue
        N, K = w.shape
        G = -(-K // gs)
        g_idx = np.arange(K) // gs
        if act_order:  # GPTQ's order: columns visited by a permutation, groups of gs in that order
            g_idx = np.empty(K, np.int64)
            g_idx[rng.permutation(K)] = np.arange(K) // gs
        q, s, z = quantize(w, g_idx, G, sym, "BF16" if fmt.startswith("ct") else "F16")
        mod = name[:-len(".weight")]
        if fmt == "awq":
            t = awq_tensors(q, s, z, awq_order)
        elif fmt.startswith("gptq"):
            t = gptq_tensors(q, s, z, g_idx, v1=fmt != "gptq_v2_asym")
        else:
            t = ct_tensors(q, s, z, sym, g_idx if act_order else None)
        files.update({f"{mod}.{k}": v for k, v in t.items()})
        deq[name] = dequantize(q, s, z, g_idx)
    return qc, files, deq
