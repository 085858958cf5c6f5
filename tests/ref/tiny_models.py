"""Tiny random checkpoints of the four Llama-family architectures, written as Hugging Face
folders (config.json + model.safetensors, F32 or BF16) and as GGUF files (as llama.cpp's
converter lays them out: Q/K rows permuted for `llama`)."""
import numpy as np

import gguf_files
from hf_files import write_folder


def make_config(arch):
    base = {
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
    }
    if arch == "llama":
        base.update(architectures=["LlamaForCausalLM"], rope_theta=500000.0,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 64})
    elif arch == "mistral":
        base.update(architectures=["MistralForCausalLM"], num_key_value_heads=1,
                    tie_word_embeddings=True)
    elif arch == "qwen2":
        base.update(architectures=["Qwen2ForCausalLM"], rope_theta=1000000.0,
                    tie_word_embeddings=True)
    elif arch == "qwen3":
        # head_dim given explicitly and != hidden / heads, as Qwen3 does.
        base.update(architectures=["Qwen3ForCausalLM"], head_dim=32, rope_theta=1000000.0)
    else:
        raise ValueError(arch)
    return base


def make_weights(cfg, seed=0):
    rng = np.random.default_rng(seed)
    d, f, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or d // nh
    arch = cfg["architectures"][0]

    def mat(o, i):
        return (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": rng.standard_normal((V, d)).astype(np.float32),
         "model.norm.weight": norm(d)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = mat(V, d)
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
        if arch == "Qwen2ForCausalLM":
            for n, o in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                w[p + f"self_attn.{n}_proj.bias"] = (0.5 * rng.standard_normal(o)).astype(np.float32)
        if arch == "Qwen3ForCausalLM":
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
    return w


def save_hf(folder, cfg, weights, dtype="F32"):
    return write_folder(folder, dict(cfg, torch_dtype=dtype.lower()), weights, dtype, indent=None)


def permute_qk(w, n_head):
    """llama.cpp's converter order for `llama` GGUF files: within each head, row 2j takes old
    row j and row 2j+1 old row j + head_dim/2 (so RoPE pairs become adjacent)."""
    rows = w.shape[0]
    hd = rows // n_head
    return w.reshape(n_head, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama",
             "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}

GGUF_LAYER_NAMES = {
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


def save_gguf(path, cfg, weights):
    import gguf
    from refmodel import rope_inv_freq

    arch = GGUF_ARCH[cfg["architectures"][0]]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
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
    wr.add_uint32("tokenizer.ggml.bos_token_id", cfg["bos_token_id"])
    wr.add_uint32("tokenizer.ggml.eos_token_id", cfg["eos_token_id"])
    wr.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    wr.add_tensor("output_norm.weight", weights["model.norm.weight"])
    if "lm_head.weight" in weights:
        wr.add_tensor("output.weight", weights["lm_head.weight"])
    if (cfg.get("rope_scaling") or {}).get("rope_type") == "llama3":
        # llama.cpp stores llama3 scaling as per-frequency divisors.
        plain = dict(cfg, rope_scaling=None)
        inv0, _ = rope_inv_freq(plain)
        inv1, _ = rope_inv_freq(cfg)
        wr.add_tensor("rope_freqs.weight", (inv0 / inv1).astype(np.float32))
    for l in range(cfg["num_hidden_layers"]):
        for hf, gg in GGUF_LAYER_NAMES.items():
            key = f"model.layers.{l}.{hf}"
            if key not in weights:
                continue
            a = weights[key]
            if arch == "llama" and hf == "self_attn.q_proj.weight":
                a = permute_qk(a, nh)
            if arch == "llama" and hf == "self_attn.k_proj.weight":
                a = permute_qk(a, nkv)
            wr.add_tensor(f"blk.{l}.{gg}", np.ascontiguousarray(a))
    gguf_files.write_out(wr)
    return path
