"""Tiny EAGLE-3 heads for tiny Llama targets (tiny_models.py): random weights written as a head
folder the way EAGLE's and SpecForge's trainers save them (config.json + model.safetensors:
fc, midlayer.*, norm, lm_head, d2t int64, t2d bool, embed_tokens optional), and a numpy float64
reference of the target's three auxiliary hidden states and of the head's step."""
import json
import os

import numpy as np

from hf_files import write_safetensors
from refmodel import RefModel, apply_rope, rmsnorm, rope_inv_freq


def head_config(target_cfg, draft_vocab=200, aux_ids=None, arch="LlamaForCausalLM", **kw):
    c = {k: target_cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                    "num_key_value_heads", "vocab_size", "max_position_embeddings",
                                    "rms_norm_eps", "rope_theta") if k in target_cfg}
    if "rope_scaling" in target_cfg:
        c["rope_scaling"] = target_cfg["rope_scaling"]
    c.update(architectures=[arch], num_hidden_layers=1, draft_vocab_size=draft_vocab,
             tie_word_embeddings=False, torch_dtype="float32")
    if aux_ids is not None:
        c["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_ids)}
    c.update(kw)
    return c


def head_weights(cfg, seed=3, own_embed=False, prefix="midlayer."):
    rng = np.random.default_rng(seed)
    d, f, V, Vd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["draft_vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = d // nh

    def mat(o, i):
        return (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    p = prefix
    w = {"fc.weight": mat(d, 3 * d), "norm.weight": norm(d), "lm_head.weight": mat(Vd, d),
         p + "input_layernorm.weight": norm(d), p + "hidden_norm.weight": norm(d),
         p + "self_attn.q_proj.weight": mat(nh * hd, 2 * d), p + "self_attn.k_proj.weight": mat(nkv * hd, 2 * d),
         p + "self_attn.v_proj.weight": mat(nkv * hd, 2 * d), p + "self_attn.o_proj.weight": mat(d, nh * hd),
         p + "post_attention_layernorm.weight": norm(d), p + "mlp.gate_proj.weight": mat(f, d),
         p + "mlp.up_proj.weight": mat(f, d), p + "mlp.down_proj.weight": mat(d, f)}
    if own_embed:
        w["embed_tokens.weight"] = rng.standard_normal((V, d)).astype(np.float32)
    # d2t: draft id i -> a distinct target id (sorted, as the trainers' frequency maps are)
    tgt = np.sort(rng.choice(V, Vd, replace=False))
    d2t = (tgt - np.arange(Vd)).astype(np.int64)
    t2d = np.zeros(V, np.bool_)
    t2d[tgt] = True
    return w, d2t, t2d


def save_head(folder, cfg, w, d2t, t2d, dtype="F32"):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    t = dict(w)
    t["d2t"] = ("I64", d2t)
    t["t2d"] = ("BOOL", t2d.astype(np.uint8))
    write_safetensors(os.path.join(folder, "model.safetensors"), t, dtype)
    return folder


def aux_layers(target_cfg, head_cfg):
    ids = (head_cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    N = target_cfg["num_hidden_layers"]
    return [i + 1 for i in ids] if ids is not None else [2, N // 2, N - 3]


def target_with_aux(target_cfg, tw, ids, layers):
    """The target's logits [n, V] and the states entering layers[0..2], concatenated [n, 3 dim]."""
    ref = RefModel(target_cfg, tw)
    seen = {}
    orig = ref.mlp

    # RefModel has no hook before a layer: run it layer by layer through its own cache.
    w, T = ref.w, len(ids)
    pos = np.arange(T)
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    L = target_cfg["num_hidden_layers"]
    for l in range(L):
        seen[l] = x.copy()
        p = f"model.layers.{l}."
        x = x + attention(ref, w, p, rmsnorm(x, w[p + "input_layernorm.weight"], ref.eps), pos, l)
        x = x + orig(l, p, rmsnorm(x, w[p + "post_attention_layernorm.weight"], ref.eps))
    logits = rmsnorm(x, w["model.norm.weight"], ref.eps) @ ref.lm_head.T
    return logits, np.concatenate([seen[l] for l in layers], -1)


def attention(ref, w, p, h, pos, cache):
    """Causal GQA attention of the normed rows h at positions pos (after the rows in ref's cache
    slot `cache`), appending their K/V there."""
    T = len(pos)
    q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, ref.nh, ref.hd)
    k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, ref.nkv, ref.hd)
    v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, ref.nkv, ref.hd)
    q = apply_rope(q, pos, ref.inv, ref.rot)
    k = apply_rope(k, pos, ref.inv, ref.rot)
    K = ref.k_cache[cache] = np.concatenate([ref.k_cache[cache], k])
    V = ref.v_cache[cache] = np.concatenate([ref.v_cache[cache], v])
    g = ref.nh // ref.nkv
    Kh, Vh = np.repeat(K, g, axis=1), np.repeat(V, g, axis=1)
    kpos = np.arange(K.shape[0])
    att = np.einsum("thd,shd->hts", q, Kh) / np.sqrt(ref.hd)
    att = np.where((pos[:, None] < kpos[None, :])[None], -np.inf, att)
    att = np.exp(att - att.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    o = np.einsum("hts,shd->thd", att, Vh).reshape(T, ref.nh * ref.hd)
    return o @ w[p + "self_attn.o_proj.weight"].T


class HeadRef:
    """The EAGLE-3 head's step in float64 (vLLM llama_eagle3.py / EAGLE cnets.py equations)."""

    def __init__(self, cfg, hw, embed, prefix="midlayer."):
        self.cfg, self.p = cfg, prefix
        self.w = {k: np.asarray(v, np.float64) for k, v in hw.items()}
        self.embed = np.asarray(hw.get("embed_tokens.weight", embed), np.float64)
        self.nh, self.nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg["hidden_size"] // self.nh
        self.eps = cfg["rms_norm_eps"]
        self.inv, self.rot = rope_inv_freq(cfg)
        self.k_cache, self.v_cache = [np.zeros((0, self.nkv, self.hd))], [np.zeros((0, self.nkv, self.hd))]

    def step(self, toks, g, pos):
        """(h' before the norm [T, dim], logits [T, draft_vocab]) for tokens at pos with input g."""
        w, p, eps = self.w, self.p, self.eps
        x = np.concatenate([rmsnorm(self.embed[np.asarray(toks)], w[p + "input_layernorm.weight"], eps),
                            rmsnorm(g, w[p + "hidden_norm.weight"], eps)], -1)
        res = rmsnorm(g, w[p + "hidden_norm.weight"], eps) if self.cfg.get("norm_before_residual") else g
        h = res + attention(self, w, p, x, np.asarray(pos), 0)
        h = h + mlp(w, p, rmsnorm(h, w[p + "post_attention_layernorm.weight"], eps))
        return h, rmsnorm(h, w["norm.weight"], eps) @ w["lm_head.weight"].T


def mlp(w, p, h):
    gate = h @ w[p + "mlp.gate_proj.weight"].T
    return (gate / (1 + np.exp(-gate)) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
