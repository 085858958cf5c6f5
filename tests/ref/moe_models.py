"""Tiny random mixture-of-experts checkpoints (Mixtral, Qwen3-MoE, Qwen2-MoE) as Hugging Face
folders (per-expert tensors as hub checkpoints have them, or transformers 5's fused
`experts.gate_up_proj` / `experts.down_proj`) and as GGUF files (stacked `ffn_*_exps` tensors,
as llama.cpp's converter writes them), and a float64 numpy reference of their MoE blocks
written from the transformers modeling code's equations."""
import numpy as np

from refmodel import RefModel, rope_inv_freq
from tiny_models import make_config, make_weights, permute_qk


def make_moe_config(arch):
    if arch == "mixtral":
        cfg = make_config("mistral")
        cfg.update(architectures=["MixtralForCausalLM"], num_key_value_heads=2,
                   tie_word_embeddings=False, num_local_experts=8, num_experts_per_tok=2,
                   rope_theta=1000000.0)
    elif arch == "qwen3moe":
        cfg = make_config("qwen3")
        # A dense first layer (mlp_only_layers) between MoE layers; renormalised top-4 of 16.
        cfg.update(architectures=["Qwen3MoeForCausalLM"], num_hidden_layers=3, num_experts=16,
                   num_experts_per_tok=4, moe_intermediate_size=32, norm_topk_prob=True,
                   decoder_sparse_step=1, mlp_only_layers=[0])
    elif arch == "qwen2moe":
        cfg = make_config("qwen2")
        # MoE on every second layer (decoder_sparse_step 2), no renormalisation, a shared expert.
        cfg.update(architectures=["Qwen2MoeForCausalLM"], num_hidden_layers=4, num_experts=8,
                   num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False,
                   decoder_sparse_step=2, mlp_only_layers=[], shared_expert_intermediate_size=64)
    else:
        raise ValueError(arch)
    return cfg


def n_experts(cfg):
    return cfg.get("num_local_experts") or cfg["num_experts"]


def expert_ffn(cfg):
    return cfg.get("moe_intermediate_size") or cfg["intermediate_size"]


def is_moe_layer(cfg, l):
    if cfg["architectures"][0] == "MixtralForCausalLM":
        return True
    step = cfg.get("decoder_sparse_step", 1)
    return l not in cfg.get("mlp_only_layers", []) and (l + 1) % step == 0


def moe_prefix(cfg, l):
    block = "block_sparse_moe" if cfg["architectures"][0] == "MixtralForCausalLM" else "mlp"
    return f"model.layers.{l}.{block}."


def expert_names(cfg):
    if cfg["architectures"][0] == "MixtralForCausalLM":
        return ("w1", "w3", "w2")
    return ("gate_proj", "up_proj", "down_proj")


def make_moe_weights(cfg, seed=0):
    """Dense weights for the dense layers; experts (per-expert names) for the MoE layers."""
    rng = np.random.default_rng(seed + 100)
    dense = {"MixtralForCausalLM": "MistralForCausalLM", "Qwen3MoeForCausalLM": "Qwen3ForCausalLM",
             "Qwen2MoeForCausalLM": "Qwen2ForCausalLM"}[cfg["architectures"][0]]
    w = make_weights(dict(cfg, architectures=[dense]), seed)  # attention, norms, dense MLPs
    d, E, F = cfg["hidden_size"], n_experts(cfg), expert_ffn(cfg)

    def mat(o, i, scale=1.0):
        return (scale * rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)
    gname, uname, dname = expert_names(cfg)
    for l in range(cfg["num_hidden_layers"]):
        if not is_moe_layer(cfg, l):
            continue
        for k in ("gate_proj", "up_proj", "down_proj"):
            del w[f"model.layers.{l}.mlp.{k}.weight"]
        p = moe_prefix(cfg, l)
        # Router logits of a few units: the top-k choice is clear (no near-ties) yet uneven.
        w[p + "gate.weight"] = mat(E, d, 3.0)
        for e in range(E):
            w[p + f"experts.{e}.{gname}.weight"] = mat(F, d)
            w[p + f"experts.{e}.{uname}.weight"] = mat(F, d)
            w[p + f"experts.{e}.{dname}.weight"] = mat(d, F)
        sf = cfg.get("shared_expert_intermediate_size")
        if sf:
            w[p + "shared_expert.gate_proj.weight"] = mat(sf, d)
            w[p + "shared_expert.up_proj.weight"] = mat(sf, d)
            w[p + "shared_expert.down_proj.weight"] = mat(d, sf)
            w[p + "shared_expert_gate.weight"] = mat(1, d)
    return w


def fuse_experts(cfg, w):
    """transformers 5's layout: experts.gate_up_proj [E, 2F, d] (gate rows first), down_proj
    [E, d, F], under `mlp.` (Mixtral's block_sparse_moe renamed too)."""
    w = dict(w)
    gname, uname, dname = expert_names(cfg)
    for l in range(cfg["num_hidden_layers"]):
        if not is_moe_layer(cfg, l):
            continue
        p, q = moe_prefix(cfg, l), f"model.layers.{l}.mlp."
        E = n_experts(cfg)
        gate = [w.pop(p + f"experts.{e}.{gname}.weight") for e in range(E)]
        up = [w.pop(p + f"experts.{e}.{uname}.weight") for e in range(E)]
        down = [w.pop(p + f"experts.{e}.{dname}.weight") for e in range(E)]
        w[q + "experts.gate_up_proj"] = np.stack([np.concatenate([g, u]) for g, u in zip(gate, up)])
        w[q + "experts.down_proj"] = np.stack(down)
        for k in list(w):
            if k.startswith(p) and p != q:
                w[q + k[len(p):]] = w.pop(k)
    return w


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class RefMoeModel(RefModel):
    """RefModel with the MoE blocks of Mixtral / Qwen2-MoE / Qwen3-MoE. Also records, per
    layer, the routing margin (k-th minus (k+1)-th probability) and the expert counts."""

    def __init__(self, cfg, weights, dtype=np.float64):
        super().__init__(cfg, weights, dtype)
        self.E, self.k = n_experts(cfg), cfg["num_experts_per_tok"]
        self.norm = cfg["architectures"][0] == "MixtralForCausalLM" or cfg.get("norm_topk_prob", False)
        self.min_margin = np.inf
        self.counts = np.zeros((cfg["num_hidden_layers"], self.E), np.int64)

    def mlp(self, l, p, h):
        if not is_moe_layer(self.cfg, l):
            return super().mlp(l, p, h)
        w, cfg = self.w, self.cfg
        q = moe_prefix(cfg, l)
        gname, uname, dname = expert_names(cfg)
        probs = softmax(h @ w[q + "gate.weight"].T)  # [T, E]
        order = np.argsort(-probs, axis=-1, kind="stable")  # ties: lower expert first
        top = order[:, : self.k]
        srt = np.take_along_axis(probs, order, -1)
        self.min_margin = min(self.min_margin, float((srt[:, self.k - 1] - srt[:, self.k]).min()))
        pw = np.take_along_axis(probs, top, -1)
        if self.norm:
            pw = pw / pw.sum(-1, keepdims=True)
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            for j in range(self.k):
                e = top[t, j]
                self.counts[l, e] += 1
                g = h[t] @ w[q + f"experts.{e}.{gname}.weight"].T
                u = h[t] @ w[q + f"experts.{e}.{uname}.weight"].T
                out[t] += pw[t, j] * ((g / (1 + np.exp(-g)) * u) @ w[q + f"experts.{e}.{dname}.weight"].T)
        if q + "shared_expert.gate_proj.weight" in w:
            g = h @ w[q + "shared_expert.gate_proj.weight"].T
            u = h @ w[q + "shared_expert.up_proj.weight"].T
            s = (g / (1 + np.exp(-g)) * u) @ w[q + "shared_expert.down_proj.weight"].T
            sg = 1 / (1 + np.exp(-(h @ w[q + "shared_expert_gate.weight"].T)))  # [T, 1]
            out = out + sg * s
        return out


GGUF_MOE_ARCH = {"MixtralForCausalLM": "llama", "Qwen3MoeForCausalLM": "qwen3moe",
                 "Qwen2MoeForCausalLM": "qwen2moe"}

DENSE_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def save_moe_gguf(path, cfg, weights, qtype=None):
    """A GGUF file as llama.cpp's converter writes MoE models: stacked experts
    blk.N.ffn_{gate,up,down}_exps [E, ...], router ffn_gate_inp, shared expert *_shexp with
    its gate ffn_gate_inp_shexp as a vector. qtype (a GGMLQuantizationType): matrices stored in
    it, except the routers (kept F32, as llama.cpp's quantizer does) and the norms. Returns
    the weights as the file holds them (dequantized), for the reference."""
    import gguf
    from gguf.quants import dequantize, quantize

    arch = GGUF_MOE_ARCH[cfg["architectures"][0]]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
    E, F = n_experts(cfg), expert_ffn(cfg)
    wr = gguf.GGUFWriter(str(path), arch)
    wr.add_block_count(cfg["num_hidden_layers"])
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_head_count(nh)
    wr.add_head_count_kv(nkv)
    wr.add_key_length(hd)
    wr.add_value_length(hd)
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    wr.add_rope_freq_base(cfg["rope_theta"])
    wr.add_rope_dimension_count(hd)
    wr.add_vocab_size(cfg["vocab_size"])
    wr.add_expert_count(E)
    wr.add_expert_used_count(cfg["num_experts_per_tok"])
    if arch != "llama":
        wr.add_expert_feed_forward_length(F)
    if cfg.get("shared_expert_intermediate_size"):
        wr.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if arch == "qwen3moe" and not cfg.get("norm_topk_prob", False):
        wr.add_expert_weights_norm(False)
    wr.add_uint32("tokenizer.ggml.bos_token_id", cfg["bos_token_id"])
    wr.add_uint32("tokenizer.ggml.eos_token_id", cfg["eos_token_id"])
    held = dict(weights)

    def put(name, a, hf_keys=None, quant=True):
        a = np.ascontiguousarray(a, np.float32)
        if qtype is not None and quant and a.ndim >= 2:
            raw = quantize(a, qtype)
            wr.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
            back = dequantize(raw, qtype).reshape(a.shape).astype(np.float32)
            for i, k in enumerate(hf_keys or []):
                held[k] = back[i] if a.ndim == 3 else back
        else:
            wr.add_tensor(name, a)
    put("token_embd.weight", weights["model.embed_tokens.weight"], ["model.embed_tokens.weight"], quant=False)
    put("output_norm.weight", weights["model.norm.weight"])
    if "lm_head.weight" in weights:
        put("output.weight", weights["lm_head.weight"], ["lm_head.weight"])
    gname, uname, dname = expert_names(cfg)
    for l in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        for hf, gg in DENSE_NAMES.items():
            key = pre + hf
            if key not in weights:
                continue
            a = weights[key]
            if arch == "llama" and hf == "self_attn.q_proj.weight":
                a = permute_qk(a, nh)
            if arch == "llama" and hf == "self_attn.k_proj.weight":
                a = permute_qk(a, nkv)
            if qtype is not None and a.ndim == 2:
                # Quantize in the file's row order, then hand the reference the HF order.
                raw = quantize(np.ascontiguousarray(a, np.float32), qtype)
                wr.add_tensor(f"blk.{l}.{gg}", raw, raw_shape=raw.shape, raw_dtype=qtype)
                back = dequantize(raw, qtype).reshape(a.shape).astype(np.float32)
                if arch == "llama" and hf in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
                    n = nh if hf.startswith("self_attn.q") else nkv
                    back = back.reshape(n, hd // 2, 2, -1).swapaxes(1, 2).reshape(back.shape)
                held[key] = back
            else:
                wr.add_tensor(f"blk.{l}.{gg}", np.ascontiguousarray(a, np.float32))
        if not is_moe_layer(cfg, l):
            continue
        p = moe_prefix(cfg, l)
        put(f"blk.{l}.ffn_gate_inp.weight", weights[p + "gate.weight"], quant=False)
        for nm, gg in ((gname, "ffn_gate_exps"), (uname, "ffn_up_exps"), (dname, "ffn_down_exps")):
            keys = [p + f"experts.{e}.{nm}.weight" for e in range(E)]
            put(f"blk.{l}.{gg}.weight", np.stack([weights[k] for k in keys]), keys)
        if p + "shared_expert.gate_proj.weight" in weights:
            for nm, gg in (("gate_proj", "ffn_gate_shexp"), ("up_proj", "ffn_up_shexp"),
                           ("down_proj", "ffn_down_shexp")):
                k = p + f"shared_expert.{nm}.weight"
                put(f"blk.{l}.{gg}.weight", weights[k], [k])
            put(f"blk.{l}.ffn_gate_inp_shexp.weight", weights[p + "shared_expert_gate.weight"].reshape(-1))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return held
