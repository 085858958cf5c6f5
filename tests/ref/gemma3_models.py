"""Tiny random Gemma 3 checkpoints written with numpy: Hugging Face folders (config.json in the
transformers 4.50, 4.55 and 5 forms, model.safetensors in F32 or BF16, the Gemma-style
tokenizer of tiny_tokenizer.py) and GGUF `gemma3` files laid out as llama.cpp's converter
writes them (norms stored as 1 + w, no output.weight when tied, the local RoPE base left out).
See gemma3_ref.py for the facts these follow and where they were read."""
import json
from pathlib import Path

import numpy as np

from bf16 import round_bf16
import gguf_files
from gemma3_ref import FULL, SLIDING, layer_types, rope_params
from hf_files import TORCH_DTYPE, write_folder
from tiny_tokenizer import add_to_gguf

# ---- configurations -----------------------------------------------------------------------

# The common part: 7 layers, so with the default pattern of 6 layers 0-4 and 6 slide and
# layer 5 is global (a tail that is not a multiple of 6); a window of 8 under prompts of 20-40.
_BASE = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 7,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "vocab_size": 300, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 32,
    "sliding_window": 8, "sliding_window_pattern": 6,
    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "rope_scaling": None,
    "final_logit_softcapping": None, "attn_logit_softcapping": None,
    "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": True,
    "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "initializer_range": 0.02,
    "use_cache": True,
}

CONFIGS = {
    # head_dim 32 given explicitly and != hidden / heads (4 x 32 = 128 != 64); 2:1 GQA.
    "tiny": dict(_BASE),
    # The 270M's attention layout (head_dim 256, 4 query heads on 1 KV head, scalar 256) on a
    # small hidden size whose square root is not a bf16 number (sqrt(160) = 12.649 -> 12.625),
    # and the 4B/12B/27B global RoPE: linear, factor 8.
    "hd256": dict(_BASE, hidden_size=160, intermediate_size=192, num_key_value_heads=1, head_dim=256,
                  query_pre_attn_scalar=256, rope_scaling={"rope_type": "linear", "factor": 8.0}),
    # What a GGUF cannot say, for the HF paths only: query_pre_attn_scalar != head_dim (as the
    # 27B), an explicit non-default layer_types list, an untied lm_head, and
    # final_logit_softcapping (null in released Gemma 3, but HF applies it when set).
    "hf-extras": dict(_BASE, num_attention_heads=2, num_key_value_heads=1, query_pre_attn_scalar=48,
                      layer_types=[SLIDING, FULL, SLIDING, SLIDING, FULL, SLIDING, SLIDING],
                      tie_word_embeddings=False, final_logit_softcapping=5.0,
                      rope_scaling={"rope_type": "linear", "factor": 4.0}),
}
GGUF_CONFIGS = ["tiny", "hd256"]  # hf-extras has values a GGUF file cannot carry


def make_config(name):
    return json.loads(json.dumps(CONFIGS[name]))


def config_json(cfg, form, dtype="float32"):
    """cfg (our canonical dict) as config.json in one of the forms transformers writes:
    "4.50" (sliding_window_pattern, no layer_types), "4.55" (as google/gemma-3-270m: layer_types
    and _sliding_window_pattern), "5" (rope_parameters per layer type, dtype)."""
    c = {k: v for k, v in cfg.items() if k not in ("sliding_window_pattern", "layer_types")}
    lt = layer_types(cfg)
    pattern = cfg.get("sliding_window_pattern", 6)
    if form == "4.50":
        assert "layer_types" not in cfg, "4.50 configs cannot list layer types"
        c.update(sliding_window_pattern=pattern, torch_dtype=dtype, transformers_version="4.50.0.dev0")
    elif form == "4.55":
        c.update(_sliding_window_pattern=pattern, layer_types=lt, torch_dtype=dtype,
                 use_bidirectional_attention=False, transformers_version="4.55.0.dev0")
    elif form == "5":
        rp = rope_params(cfg)
        for k in ("rope_theta", "rope_local_base_freq", "rope_scaling"):
            c.pop(k, None)
        c.update(layer_types=lt, rope_parameters={SLIDING: rp[SLIDING], FULL: rp[FULL]}, dtype=dtype,
                 use_bidirectional_attention=False, transformers_version="5.17.0")
    else:
        raise ValueError(form)
    return c


# ---- weights ------------------------------------------------------------------------------

def make_weights(cfg, seed=0):
    """Random weights in HF names and layouts. Norm weights are HF's w (the model uses 1 + w),
    spread so that 1 + w is far from 1 (a missing or doubled +1 shows at once)."""
    rng = np.random.default_rng(seed)
    d, f, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def mat(o, i):
        return (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)

    def norm(n):
        return (0.4 * rng.standard_normal(n)).astype(np.float32)

    # Rows of norm ~1 after the sqrt(hidden) scale: embeddings of about 1/sqrt(d) each.
    w = {"model.embed_tokens.weight": (rng.standard_normal((V, d)) / np.sqrt(d)).astype(np.float32),
         "model.norm.weight": norm(d)}
    if not cfg.get("tie_word_embeddings", True):
        w["lm_head.weight"] = mat(V, d)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            w[p + n + ".weight"] = norm(d)
        w[p + "self_attn.q_proj.weight"] = mat(nh * hd, d)
        w[p + "self_attn.k_proj.weight"] = mat(nkv * hd, d)
        w[p + "self_attn.v_proj.weight"] = mat(nkv * hd, d)
        w[p + "self_attn.o_proj.weight"] = mat(d, nh * hd)
        w[p + "self_attn.q_norm.weight"] = norm(hd)
        w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "mlp.gate_proj.weight"] = mat(f, d)
        w[p + "mlp.up_proj.weight"] = mat(f, d)
        w[p + "mlp.down_proj.weight"] = mat(d, f)
    return w


# ---- writers ------------------------------------------------------------------------------

def save_hf(folder, cfg, weights, dtype="F32", form="5", tokenizer=True):
    return write_folder(folder, config_json(cfg, form, TORCH_DTYPE[dtype]), weights, dtype, tokenizer=tokenizer)


GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def save_gguf(path, cfg, weights, tokenizer=True, encode=None):
    """An F32 GGUF `gemma3` file as convert_hf_to_gguf.py writes one: every *norm.weight stored
    as 1 + w, no output.weight (tied), global rope theta as rope.freq_base, the local base and
    the layer pattern left to the reader (llama.cpp hard-codes 10000 and 6).
    encode(gguf_name, f32 array) -> (data, raw ggml type or None) stores a tensor in another
    type (quantized files: read them back with load_gguf to get the values stored)."""
    import gguf
    assert layer_types(cfg) == [SLIDING if (i + 1) % 6 else FULL for i in range(cfg["num_hidden_layers"])], \
        "llama.cpp hard-codes the pattern of 6"
    assert cfg["query_pre_attn_scalar"] == cfg["head_dim"], "llama.cpp scales by 1/sqrt(head_dim)"
    assert cfg.get("tie_word_embeddings", True) and not cfg.get("final_logit_softcapping")
    rp = rope_params(cfg)
    assert rp[SLIDING]["rope_theta"] == 10_000.0 and rp[SLIDING]["rope_type"] == "default"
    wr = gguf.GGUFWriter(str(path), "gemma3")
    wr.add_name("tiny-gemma3")
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_block_count(cfg["num_hidden_layers"])
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_head_count(cfg["num_attention_heads"])
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    wr.add_key_length(cfg["head_dim"])
    wr.add_value_length(cfg["head_dim"])
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M if encode else gguf.LlamaFileType.ALL_F32)
    wr.add_rope_freq_base(rp[FULL]["rope_theta"])
    wr.add_sliding_window(cfg["sliding_window"])
    wr.add_head_count_kv(cfg["num_key_value_heads"])
    if rp[FULL]["rope_type"] == "linear":
        wr.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        wr.add_rope_scaling_factor(rp[FULL]["factor"])
    if tokenizer:
        add_to_gguf(wr, cfg["vocab_size"])
    def add(name, a):
        data, raw_dtype = encode(name, a) if encode else (a, None)
        wr.add_tensor(name, np.ascontiguousarray(data), raw_dtype=raw_dtype)

    add("token_embd.weight", np.asarray(weights["model.embed_tokens.weight"], np.float32))
    add("output_norm.weight", (weights["model.norm.weight"] + np.float32(1)).astype(np.float32))
    for l in range(cfg["num_hidden_layers"]):
        for hf, gg in GGUF_LAYER_NAMES.items():
            a = np.asarray(weights[f"model.layers.{l}.{hf}"], np.float32)
            if hf.endswith("norm.weight"):
                a = (a + np.float32(1)).astype(np.float32)
            add(f"blk.{l}.{gg}", a)
    gguf_files.write_out(wr)
    return Path(path)


def load_gguf(path):
    """Reads a `gemma3` GGUF back the way llama.cpp does (the spec kaon's loader follows):
    (config in our canonical form, HF-named weights with HF's norm convention w = stored - 1).
    Not in the file, so taken as llama.cpp hard-codes them: the local RoPE base 10000, the
    pattern of 6, attention scale 1/sqrt(head_dim) (1/sqrt(hidden / heads) for 62 layers)."""
    kv, top, blocks = gguf_files.read(path, "gemma3")
    L, d, nh = int(kv("block_count")), int(kv("embedding_length")), int(kv("attention.head_count"))
    hd = int(kv("attention.key_length", d // nh))
    cfg = {"architectures": ["Gemma3ForCausalLM"], "hidden_size": d, "num_hidden_layers": L,
           "intermediate_size": int(kv("feed_forward_length")), "num_attention_heads": nh,
           "num_key_value_heads": int(kv("attention.head_count_kv", nh)), "head_dim": hd,
           "max_position_embeddings": int(kv("context_length")),
           "rms_norm_eps": float(kv("attention.layer_norm_rms_epsilon")),
           "rope_theta": float(kv("rope.freq_base", 1_000_000.0)), "rope_local_base_freq": 10_000.0,
           "query_pre_attn_scalar": d // nh if L == 62 else hd,
           "final_logit_softcapping": kv("final_logit_softcapping"), "tie_word_embeddings": True}
    window = kv("attention.sliding_window")
    cfg["sliding_window"] = int(window) if window else None
    cfg["layer_types"] = [SLIDING if window and i % 6 < 5 else FULL for i in range(L)]
    if kv("rope.scaling.type") == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(kv("rope.scaling.factor"))}
    cfg["vocab_size"] = top["model.embed_tokens.weight"].shape[0]
    if "lm_head.weight" in top:
        cfg["tie_word_embeddings"] = False
    w = dict(top)
    w["model.norm.weight"] = top["model.norm.weight"] - np.float32(1)
    names = {v.rsplit(".", 1)[0]: k for k, v in GGUF_LAYER_NAMES.items()}
    for (l, kind), a in blocks.items():
        hf = names[kind]
        w[f"model.layers.{l}.{hf}"] = a - np.float32(1) if hf.endswith("norm.weight") else a
    return cfg, w


def model_of(name, fmt, tmp, form="5", seed=None):
    """(model path, HF-named weights the reference must see, cfg) for one config and format:
    F32 / BF16 (safetensors) or GGUF (F32)."""
    cfg = make_config(name)
    w = make_weights(cfg, seed=list(CONFIGS).index(name) if seed is None else seed)
    if fmt == "BF16":
        w = round_bf16(w)  # the reference sees exactly the stored bf16 values
    tmp = Path(tmp)
    if fmt == "GGUF":
        return save_gguf(tmp / f"gemma3-{name}.gguf", cfg, w), w, cfg
    return save_hf(tmp / f"gemma3-{name}-{fmt}-{form}", cfg, w, fmt, form), w, cfg
