"""The example plugin's architecture (examples/plugin/, KaonExampleForCausalLM): a tiny random
checkpoint and a numpy reference forward pass written from its definition: Llama, with
x = embed * embedding_multiplier, x += sublayer * residual_multiplier, and
logits = c * tanh(logits / c) for c = final_logit_softcapping."""
import os
from pathlib import Path

import numpy as np

from hf_files import write_folder
from refmodel import apply_rope, rmsnorm, rope_inv_freq

ARCH = "KaonExampleForCausalLM"


def plugin_path(build, name="kaon_example"):
    """A plugin the build made (build/plugins/NAME.so)."""
    return Path(build) / "plugins" / f"{name}.so"


def build_dir():
    return Path(os.environ.get("KAON_BUILD", Path(__file__).resolve().parents[2] / "build"))


def make_config(embedding_multiplier=4.0, residual_multiplier=0.5, softcap=3.0):
    cfg = {
        "architectures": [ARCH], "model_type": "kaon_example",
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "bos_token_id": 2, "eos_token_id": 1,
        "embedding_multiplier": embedding_multiplier, "residual_multiplier": residual_multiplier,
    }
    if softcap:
        cfg["final_logit_softcapping"] = softcap
    return cfg


def make_weights(cfg, seed=0):
    rng = np.random.default_rng(seed)
    d, f, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = d // nh

    def mat(o, i):
        return (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": (0.5 * rng.standard_normal((V, d))).astype(np.float32),
         "model.norm.weight": norm(d), "lm_head.weight": mat(V, d)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = norm(d)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        w[p + "self_attn.q_proj.weight"] = mat(nh * hd, d)
        w[p + "self_attn.k_proj.weight"] = mat(nkv * hd, d)
        w[p + "self_attn.v_proj.weight"] = mat(nkv * hd, d)
        w[p + "self_attn.o_proj.weight"] = mat(d, nh * hd)
        w[p + "mlp.gate_proj.weight"] = mat(f, d)
        w[p + "mlp.up_proj.weight"] = mat(f, d)
        w[p + "mlp.down_proj.weight"] = mat(d, f)
    return w


def save(folder, cfg, w, tokenizer=False):
    return write_folder(folder, dict(cfg, torch_dtype="float32"), w, "F32", tokenizer=tokenizer, indent=None)


def reference_logits(cfg, w, ids):
    """Logits [len(ids), vocab] of one prefill of ids, in float64."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps = cfg["hidden_size"] // nh, cfg["rms_norm_eps"]
    em, rm = cfg.get("embedding_multiplier", 1.0), cfg.get("residual_multiplier", 1.0)
    inv, rot = rope_inv_freq(cfg)
    T = len(ids)
    pos = np.arange(T)
    x = w["model.embed_tokens.weight"][np.asarray(ids)] * em
    causal = pos[:, None] < pos[None, :]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = apply_rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd), pos, inv, rot)
        k = apply_rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd), pos, inv, rot)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
        s = np.where(causal[None], -np.inf, s)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(T, nh * hd)
        x = x + (o @ w[p + "self_attn.o_proj.weight"].T) * rm
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T) * rm
    logits = rmsnorm(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T
    cap = cfg.get("final_logit_softcapping")
    return cap * np.tanh(logits / cap) if cap else logits
