"""A numpy reference forward pass of the Llama family (Llama, Mistral, Qwen2, Qwen3), written
from the Hugging Face modeling code's equations, independent of kaon. Weights use HF names and
layouts ([out, in]); RoPE is HF's rotate_half (NeoX) convention."""
import numpy as np


def rope_inv_freq(cfg):
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rot = int(hd * cfg.get("partial_rotary_factor", 1.0))
    theta = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (theta ** (np.arange(0, rot, 2, dtype=np.float64) / rot))
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * np.pi / inv
        scaled = np.where(wl > lo_wl, inv / factor, inv)
        smooth = (old / wl - lo) / (hi - lo)
        mid = (1 - smooth) * inv / factor + smooth * inv
        is_mid = (wl >= hi_wl) & (wl <= lo_wl)
        inv = np.where(is_mid, mid, scaled)
    elif kind == "linear":
        inv = inv / rs["factor"]
    return inv, rot


def rmsnorm(x, w, eps):
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + eps) * w


def apply_rope(x, pos, inv, rot):
    # x [T, H, hd]; NeoX halves on the first rot dims.
    ang = pos[:, None].astype(np.float64) * inv[None, :]  # [T, rot/2]
    cos = np.cos(ang)[:, None, :].astype(x.dtype)
    sin = np.sin(ang)[:, None, :].astype(x.dtype)
    h = rot // 2
    x1, x2 = x[..., :h], x[..., h:rot]
    out = x.copy()
    out[..., :h] = x1 * cos - x2 * sin
    out[..., h:rot] = x2 * cos + x1 * sin
    return out


class RefModel:
    def __init__(self, cfg, weights, dtype=np.float64):
        self.cfg = cfg
        self.dt = dtype
        self.w = {k: np.asarray(v, dtype=dtype) for k, v in weights.items()}
        self.nh = cfg["num_attention_heads"]
        self.nkv = cfg.get("num_key_value_heads", self.nh)
        self.hd = cfg.get("head_dim") or cfg["hidden_size"] // self.nh
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.inv, self.rot = rope_inv_freq(cfg)
        self.arch = cfg["architectures"][0]
        self.lm_head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        self.kv_quant = None  # f(x) -> x as the cache stores it, or None
        self.reset()

    def reset(self):
        L = self.cfg["num_hidden_layers"]
        self.k_cache = [np.zeros((0, self.nkv, self.hd), self.dt) for _ in range(L)]
        self.v_cache = [np.zeros((0, self.nkv, self.hd), self.dt) for _ in range(L)]

    def forward(self, ids):
        """Feeds ids after what is cached; returns logits [len(ids), vocab]."""
        w, T = self.w, len(ids)
        start = self.k_cache[0].shape[0]
        pos = np.arange(start, start + T)
        x = w["model.embed_tokens.weight"][np.asarray(ids)]
        for l in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{l}."
            h = rmsnorm(x, w[p + "input_layernorm.weight"], self.eps)
            q = h @ w[p + "self_attn.q_proj.weight"].T
            k = h @ w[p + "self_attn.k_proj.weight"].T
            v = h @ w[p + "self_attn.v_proj.weight"].T
            if p + "self_attn.q_proj.bias" in w:
                q = q + w[p + "self_attn.q_proj.bias"]
                k = k + w[p + "self_attn.k_proj.bias"]
                v = v + w[p + "self_attn.v_proj.bias"]
            q = q.reshape(T, self.nh, self.hd)
            k = k.reshape(T, self.nkv, self.hd)
            v = v.reshape(T, self.nkv, self.hd)
            if p + "self_attn.q_norm.weight" in w:
                q = rmsnorm(q, w[p + "self_attn.q_norm.weight"], self.eps)
                k = rmsnorm(k, w[p + "self_attn.k_norm.weight"], self.eps)
            q = apply_rope(q, pos, self.inv, self.rot)
            k = apply_rope(k, pos, self.inv, self.rot)
            if self.kv_quant:  # what a quantized KV cache gives back (e.g. e4m3 round trips)
                k, v = self.kv_quant(k), self.kv_quant(v)
            K = self.k_cache[l] = np.concatenate([self.k_cache[l], k])
            V = self.v_cache[l] = np.concatenate([self.v_cache[l], v])
            S = K.shape[0]
            g = self.nh // self.nkv
            Kh = np.repeat(K, g, axis=1)  # [S, nh, hd]
            Vh = np.repeat(V, g, axis=1)
            # A Python float scale: a numpy float64 scalar would promote float32 to float64 (NEP 50).
            att = np.einsum("thd,shd->hts", q, Kh) / float(np.sqrt(self.hd))
            mask = pos[:, None] < np.arange(S)[None, :]
            att = np.where(mask[None], -np.inf, att)
            att = att - att.max(-1, keepdims=True)
            att = np.exp(att)
            att /= att.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", att, Vh).reshape(T, self.nh * self.hd)
            x = x + o @ w[p + "self_attn.o_proj.weight"].T
            h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], self.eps)
            x = x + self.mlp(l, p, h)
        x = rmsnorm(x, w["model.norm.weight"], self.eps)
        return x @ self.lm_head.T

    def mlp(self, l, p, h):
        """Layer l's MLP (names under prefix p) of the normed hidden states h [T, dim]."""
        w = self.w
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        act = gate / (1 + np.exp(-gate)) * up
        return act @ w[p + "mlp.down_proj.weight"].T
