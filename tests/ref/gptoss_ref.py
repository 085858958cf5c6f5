"""gpt-oss (transformers' modeling_gpt_oss.py) in float64 numpy, and tiny random checkpoints of
it. The facts ported: RMSNorm; q/k/v/o with biases; NeoX RoPE with YaRN (truncate false: the
ramp's ends are not rounded; cos/sin times 0.1 ln(factor) + 1); sliding layers attend to keys
k > q - window; a per-head sink logit joins each softmax's denominator; router logits with
bias, top-k, softmax over the k; experts gate_up_proj [E, hidden, 2 ffn] with gate = columns
0::2 and up = 1::2, gate clamped max 7, up to [-7, 7], (up + 1) * gate * sigmoid(1.702 gate),
down_proj [E, ffn, hidden]; biases on both."""
import math

import numpy as np

from bf16 import round_bf16
from hf_files import TORCH_DTYPE, write_folder

SLIDING, FULL = "sliding_attention", "full_attention"

CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
    "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_local_experts": 4, "num_experts_per_tok": 2, "experts_per_token": 2,
    "vocab_size": 300, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
    "sliding_window": 8, "layer_types": [SLIDING, FULL, SLIDING, FULL],
    "rope_theta": 10000.0, "swiglu_limit": 7.0, "attention_bias": True, "hidden_act": "silu",
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 64, "truncate": False},
    "tie_word_embeddings": False, "attention_dropout": 0.0, "initializer_range": 0.02,
    "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "use_cache": True,
}


def make_weights(cfg=CONFIG, seed=0):
    """Random weights under HF's names and shapes; scales chosen so the SwiGLU clamps bite."""
    r = np.random.default_rng(seed)
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh, nkv, hd, E, F = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                         cfg["num_local_experts"], cfg["intermediate_size"])
    n = lambda *s, sc=1.0: (r.standard_normal(s) * sc).astype(np.float32)
    w = {"model.embed_tokens.weight": n(V, H), "model.norm.weight": 1 + n(H, sc=0.1),
         "lm_head.weight": n(V, H, sc=H ** -0.5)}
    for l in range(L):
        p = f"model.layers.{l}."
        w.update({
            p + "input_layernorm.weight": 1 + n(H, sc=0.1), p + "post_attention_layernorm.weight": 1 + n(H, sc=0.1),
            p + "self_attn.q_proj.weight": n(nh * hd, H, sc=H ** -0.5), p + "self_attn.q_proj.bias": n(nh * hd, sc=0.1),
            p + "self_attn.k_proj.weight": n(nkv * hd, H, sc=H ** -0.5), p + "self_attn.k_proj.bias": n(nkv * hd, sc=0.1),
            p + "self_attn.v_proj.weight": n(nkv * hd, H, sc=H ** -0.5), p + "self_attn.v_proj.bias": n(nkv * hd, sc=0.1),
            p + "self_attn.o_proj.weight": n(H, nh * hd, sc=(nh * hd) ** -0.5), p + "self_attn.o_proj.bias": n(H, sc=0.1),
            p + "self_attn.sinks": n(nh),
            p + "mlp.router.weight": n(E, H, sc=H ** -0.5), p + "mlp.router.bias": n(E, sc=0.5),
            p + "mlp.experts.gate_up_proj": n(E, H, 2 * F, sc=0.6), p + "mlp.experts.gate_up_proj_bias": n(E, 2 * F),
            p + "mlp.experts.down_proj": n(E, F, H, sc=0.3 * F ** -0.5), p + "mlp.experts.down_proj_bias": n(E, H, sc=0.1),
        })
    return w


def save_hf(folder, w, dtype="F32", cfg=CONFIG):
    """An HF folder (tiny tokenizer); returns (path, the weights as stored, rounded for BF16)."""
    cfg = dict(cfg, torch_dtype=TORCH_DTYPE[dtype])
    stored = round_bf16(w) if dtype == "BF16" else w
    return write_folder(folder, cfg, w, dtype, tokenizer=True), stored


def yarn_inv_freq(cfg):
    """HF's _compute_yarn_parameters: (inv_freq [hd/2], attention_factor)."""
    rs, dim, base = cfg["rope_scaling"], cfg["head_dim"], cfg["rope_theta"]
    factor, omax = rs["factor"], rs["original_max_position_embeddings"]
    corr = lambda rot: dim * math.log(omax / (rot * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = corr(rs["beta_fast"]), corr(rs["beta_slow"])
    if rs.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(dim // 2) - lo) / (hi - lo), 0, 1)
    extrap = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    inv = extrap / factor * ramp + extrap * (1 - ramp)
    return inv, 0.1 * math.log(factor) + 1.0


def forward(cfg, w, ids):
    """Logits [len(ids), vocab] of one causal forward over ids (float64)."""
    W = {k: np.asarray(v, np.float64) for k, v in w.items()}
    T, nh, nkv, hd = len(ids), cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    E, K, eps, lim = cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["rms_norm_eps"], cfg["swiglu_limit"]
    norm = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    inv, af = yarn_inv_freq(cfg)
    ang = np.arange(T)[:, None] * inv[None]
    cos, sin = np.cos(ang) * af, np.sin(ang) * af  # [T, hd/2]

    def rope(x):  # [T, heads, hd], NeoX halves
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        c, s = cos[:, None], sin[:, None]
        return np.concatenate([a * c - b * s, b * c + a * s], -1)

    x = W["model.embed_tokens.weight"][ids]
    qi, ki = np.arange(T)[:, None], np.arange(T)[None]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        lin = lambda v, n: v @ W[p + n + ".weight"].T + W[p + n + ".bias"]
        h = norm(x, W[p + "input_layernorm.weight"])
        q = rope(lin(h, "self_attn.q_proj").reshape(T, nh, hd))
        k = rope(lin(h, "self_attn.k_proj").reshape(T, nkv, hd))
        v = lin(h, "self_attn.v_proj").reshape(T, nkv, hd)
        mask = ki <= qi
        if cfg["layer_types"][l] == SLIDING:
            mask &= ki > qi - cfg["sliding_window"]
        att = np.zeros((T, nh, hd))
        for hh in range(nh):
            g = hh // (nh // nkv)
            s = np.where(mask, q[:, hh] @ k[:, g].T * hd ** -0.5, -np.inf)
            sink = W[p + "self_attn.sinks"][hh]
            m = np.maximum(s.max(-1, keepdims=True), sink)
            e = np.exp(s - m)
            att[:, hh] = (e / (e.sum(-1, keepdims=True) + np.exp(sink - m))) @ v[:, g]
        x = x + att.reshape(T, -1) @ W[p + "self_attn.o_proj.weight"].T + W[p + "self_attn.o_proj.bias"]
        h = norm(x, W[p + "post_attention_layernorm.weight"])
        logits = h @ W[p + "mlp.router.weight"].T + W[p + "mlp.router.bias"]
        out = np.zeros_like(x)
        for t in range(T):
            top = np.argsort(-logits[t], kind="stable")[:K]
            pr = np.exp(logits[t, top] - logits[t, top].max())
            pr /= pr.sum()
            for e, pe in zip(top, pr):
                gu = h[t] @ W[p + "mlp.experts.gate_up_proj"][e] + W[p + "mlp.experts.gate_up_proj_bias"][e]
                gate, up = np.minimum(gu[::2], lim), np.clip(gu[1::2], -lim, lim)
                y = (up + 1) * gate / (1 + np.exp(-1.702 * gate))
                out[t] += pe * (y @ W[p + "mlp.experts.down_proj"][e] + W[p + "mlp.experts.down_proj_bias"][e])
        x = x + out
    return norm(x, W["model.norm.weight"]) @ W["lm_head.weight"].T
