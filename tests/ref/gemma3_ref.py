"""A numpy float64 reference forward pass of Gemma 3 text models (HF `Gemma3ForCausalLM`,
model_type `gemma3_text`; GGUF arch `gemma3`), written from the equations of transformers'
modeling code, independent of kaon. Weights use HF names and layouts ([out, in]); the norm
weights are HF's (the model multiplies by 1 + w).

Facts, and where each was read (transformers = huggingface/transformers,
src/transformers/models/gemma3/; llama.cpp = ggml-org/llama.cpp):

 1. RMSNorm (Gemma3RMSNorm = Gemma2RMSNorm): y = x.float() * rsqrt(mean(x.float()^2) + eps)
    * (1 + w.float()), then cast to x's dtype; w is initialised to zeros.
    [modeling_gemma3.py @ f14d0cbc (4.57-era); v5 modular_gemma3.py inherits it unchanged]
 2. llama.cpp's converter stores every norm with the +1 ALREADY ADDED: Gemma3Model.norm_shift
    returns 1.0 for any HF name ending "norm.weight" (input_layernorm, post_attention_layernorm,
    pre_feedforward_layernorm, post_feedforward_layernorm, self_attn.q_norm, self_attn.k_norm,
    model.norm), and modify_tensors adds it; the graph (src/models/gemma3.cpp) multiplies by the
    stored weight plainly (build_norm, LLM_NORM_RMS). So kaon must NOT add 1 for GGUF files.
    [convert_hf_to_gguf.py class Gemma3Model; src/models/gemma3.cpp @ 569a0092]
 3. Embeddings are scaled by sqrt(hidden_size): Gemma3TextScaledWordEmbedding returns
    embed(ids) * embed_scale.to(weight.dtype), so a bf16 model multiplies by the bf16-rounded
    scale (sqrt(640) = 25.298 -> 25.25; sqrt(1152) = 33.94 -> 34.0; sqrt(64) = 8 exactly).
    llama.cpp: ggml_scale(inpL, sqrtf(n_embd)) in f32. [modeling_gemma3.py; gemma3.cpp]
 4. Attention: q/k/v projections (attention_bias False by default), q_norm and k_norm are
    RMSNorms over head_dim applied per head (one weight [head_dim] shared by all heads) BEFORE
    RoPE; scaling = query_pre_attn_scalar ** -0.5 (not head_dim ** -0.5 in general: 27B has
    168 vs head_dim 128). attn_logit_softcapping is NOT applied by Gemma3Attention (it is not
    passed to the attention function; llama.cpp's converter asserts it is None).
    llama.cpp has no GGUF key for query_pre_attn_scalar: f_attention_scale = 1/sqrt(head_dim),
    except n_layer == 62 (27B): 1/sqrt(n_embd / n_head). [modeling_gemma3.py; llama-model.cpp
    LLM_ARCH_GEMMA3 hparams]
 5. Decoder layer ("sandwich" norms):
        h = x + post_attention_layernorm(attn(input_layernorm(x)))
        out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))
    MLP: down(act(gate(x)) * up(x)), hidden_activation "gelu_pytorch_tanh"
    (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))). [Gemma3DecoderLayer, Gemma3MLP]
 6. Output: norm, lm_head, then final_logit_softcapping if not None: c * tanh(logits / c)
    (None in every Gemma 3 config). tie_word_embeddings defaults to True and the checkpoints
    carry no lm_head.weight. [Gemma3ForCausalLM.forward; configuration_gemma3.py]
 7. Which layers slide: transformers 4.50 configs carry "sliding_window_pattern": 6 (layer i
    slides iff (i + 1) % pattern != 0); 4.55+ write "layer_types" (a list of
    "sliding_attention" / "full_attention") and "_sliding_window_pattern": 6; transformers 5
    reads layer_types, else builds it from the "sliding_window_pattern" kwarg (default 6).
    llama.cpp hard-codes set_swa_pattern(6) (layer il slides iff il % 6 < 5, the same rule),
    and only when gemma3.attention.sliding_window is present and > 0.
    [modular_gemma3.py; configuration_gemma3.py (v5 dataclass form); llama-model.cpp]
 8. Sliding mask: key k is visible from query q iff k <= q and q - k < sliding_window (the
    window counts the query itself). HF masking_utils.sliding_window_overlay: kv_idx > q_idx -
    sliding_window; llama.cpp is_masked_swa (LLAMA_SWA_TYPE_STANDARD): masked iff
    p1 - p0 >= n_swa. Full layers are plainly causal.
 9. RoPE is NeoX style (rotate_half: dims i and i + head_dim/2 pair up), over all of head_dim;
    llama.cpp lists LLM_ARCH_GEMMA3 under LLAMA_ROPE_TYPE_NEOX (llama_model_rope_type) and its
    converter does not permute Gemma 3's q/k rows, so GGUF files keep HF's row order.
    Sliding layers use theta = rope_local_base_freq (default 10000) and no scaling; full layers
    use rope_theta (default 1e6) and rope_scaling ("linear", factor 8 on 4B/12B/27B; null on
    270M/1B): linear divides inv_freq by factor. HF computes inv_freq and the angles in f32.
    llama.cpp: gemma3.rope.freq_base = the GLOBAL theta; the local base is hard-coded
    (rope_freq_base_train_swa = 10000, rope_freq_scale_train_swa = 1); linear scaling is stored
    as gemma3.rope.scaling.type = "linear" + gemma3.rope.scaling.factor and applies to non-SWA
    layers only. [modeling_gemma3.py Gemma3RotaryEmbedding; llama-model.cpp; converter]
10. Config forms kaon must parse (all three are written by gemma3_models.config_json):
    - 4.50 hub form: rope_theta, rope_local_base_freq, rope_scaling, sliding_window_pattern,
      no layer_types, "torch_dtype".
    - 4.55 hub form (google/gemma-3-270m): rope_theta, rope_local_base_freq, rope_scaling,
      "_sliding_window_pattern": 6, layer_types, use_bidirectional_attention, "torch_dtype".
    - transformers 5 form: Gemma3TextConfig.convert_rope_params_to_dict pops rope_scaling,
      rope_theta and rope_local_base_freq into
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}
      (full_attention gains "rope_type": "linear", "factor": 8.0 when scaled); layer_types is
      always present; "dtype" replaces "torch_dtype". Every other key keeps its name
      (vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
      num_key_value_heads, head_dim, hidden_activation, max_position_embeddings,
      initializer_range, rms_norm_eps, use_cache, pad_token_id, eos_token_id, bos_token_id,
      tie_word_embeddings, attention_bias, attention_dropout, query_pre_attn_scalar,
      sliding_window, layer_types, final_logit_softcapping, attn_logit_softcapping,
      use_bidirectional_attention, model_type "gemma3_text"). UNCERTAIN: whether 5.17's to_dict
      keeps "_sliding_window_pattern"; tests/gpu/test_gemma3_hf.py records the config.json that
      5.17 actually saves. [configuration_gemma3.py, v5 dataclass form (index id 65907536900);
      modular_gemma3.py v5 __init__ form (index id 2406732525)]
11. Defaults (Gemma3TextConfig): vocab_size 262208, hidden_size 2304, intermediate_size 9216,
    num_hidden_layers 26, num_attention_heads 8, num_key_value_heads 4, head_dim 256,
    max_position_embeddings 131072, rms_norm_eps 1e-6, pad 0 / eos 1 / bos 2,
    query_pre_attn_scalar 256, sliding_window 4096, tie_word_embeddings True.
12. GGUF names (gguf-py MODEL_TENSORS[GEMMA3], checked with gguf 0.19.0 here): token_embd,
    output_norm, output (absent when tied), blk.N.{attn_norm, attn_q, attn_k, attn_v,
    attn_q_norm, attn_k_norm, attn_output, post_attention_norm, ffn_norm (=
    pre_feedforward_layernorm), ffn_gate, ffn_up, ffn_down, post_ffw_norm}. Metadata written by
    the converter: gemma3.{context_length, embedding_length, block_count, feed_forward_length,
    attention.head_count, attention.head_count_kv, attention.layer_norm_rms_epsilon,
    attention.key_length, attention.value_length, rope.freq_base, attention.sliding_window},
    optional rope.scaling.{type,factor} and final_logit_softcapping; general.file_type. No
    rope.dimension_count, no sliding-window pattern, no query_pre_attn_scalar. The converter
    also cuts token_embd to the tokenizer's real vocabulary size. gemma3_models.load_gguf reads
    a file back by these rules.
"""
import math

import numpy as np

from bf16 import bf16_round
from np_ops import rmsnorm, rope, softmax

SLIDING, FULL = "sliding_attention", "full_attention"


def text_config(cfg):
    """The text part of a Gemma 3 config.json (Gemma3ForConditionalGeneration nests it)."""
    return cfg.get("text_config") or cfg


def layer_types(cfg):
    c = text_config(cfg)
    L = c["num_hidden_layers"]
    if c.get("layer_types"):
        lt = list(c["layer_types"])
        assert len(lt) == L and set(lt) <= {SLIDING, FULL}, lt
        return lt
    p = c.get("sliding_window_pattern", c.get("_sliding_window_pattern", 6))
    return [SLIDING if (i + 1) % p else FULL for i in range(L)]


def rope_params(cfg):
    """{layer type: {"rope_type", "rope_theta", ["factor"]}} from any of the config forms."""
    c = text_config(cfg)
    rp = c.get("rope_parameters")
    if rp and set(rp) <= {SLIDING, FULL}:
        full = dict(rp.get(FULL) or {"rope_type": "default"})
        slide = dict(rp.get(SLIDING) or {"rope_type": "default"})
    else:
        full = dict(rp or c.get("rope_scaling") or {"rope_type": "default"})
        slide = {"rope_type": "default"}
    full.setdefault("rope_theta", c.get("rope_theta", 1_000_000.0))
    slide.setdefault("rope_theta", c.get("rope_local_base_freq", 10_000.0))
    for p in (full, slide):
        p["rope_type"] = p.get("rope_type", p.get("type", "default"))
    return {FULL: full, SLIDING: slide}


def inv_freq(p, head_dim):
    inv = 1.0 / (float(p["rope_theta"]) ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    kind = p["rope_type"]
    if kind == "linear":
        inv = inv / float(p["factor"])
    elif kind != "default":
        raise NotImplementedError(f"rope_type {kind!r} in the Gemma 3 reference")
    return inv


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


class Gemma3Ref:
    """Gemma 3 forward in float64 with a KV cache: forward(ids) feeds ids after what is cached
    and returns their logits [len(ids), vocab].

    embed_scale: "f32" multiplies the embeddings by float32(sqrt(hidden)) (HF in f32, llama.cpp),
    "bf16" by the bf16-rounded value (HF running the model in bf16)."""

    def __init__(self, cfg, weights, embed_scale="f32"):
        c = self.c = text_config(cfg)
        if c.get("use_bidirectional_attention"):
            raise NotImplementedError("use_bidirectional_attention (EmbeddingGemma) is not causal LM")
        self.w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
        self.d = c["hidden_size"]
        self.L = c["num_hidden_layers"]
        self.nh = c["num_attention_heads"]
        self.nkv = c.get("num_key_value_heads", self.nh)
        self.hd = c.get("head_dim", 256)
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.window = c.get("sliding_window", 4096)
        self.types = layer_types(cfg)
        rp = rope_params(cfg)
        self.inv = {t: inv_freq(rp[t], self.hd) for t in (SLIDING, FULL)}
        self.scale = float(c.get("query_pre_attn_scalar", 256)) ** -0.5
        self.softcap = c.get("final_logit_softcapping")
        act = c.get("hidden_activation", c.get("hidden_act", "gelu_pytorch_tanh"))
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise NotImplementedError(f"hidden_activation {act!r}")
        s = math.sqrt(self.d)
        self.embed_scale = bf16_round(s) if embed_scale == "bf16" else float(np.float32(s))
        tied = c.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True))
        self.lm_head = self.w["model.embed_tokens.weight"] if tied else self.w["lm_head.weight"]
        self.reset()

    def reset(self):
        self.K = [np.zeros((0, self.nkv, self.hd)) for _ in range(self.L)]
        self.V = [np.zeros((0, self.nkv, self.hd)) for _ in range(self.L)]

    def norm(self, x, name):
        return rmsnorm(x, 1.0 + self.w[name], self.eps)  # Gemma multiplies by 1 + w

    def forward(self, ids):
        w, T = self.w, len(ids)
        start = self.K[0].shape[0]
        pos = np.arange(start, start + T)
        x = w["model.embed_tokens.weight"][np.asarray(ids)] * self.embed_scale
        g = self.nh // self.nkv
        for l in range(self.L):
            p = f"model.layers.{l}."
            kind = self.types[l]
            h = self.norm(x, p + "input_layernorm.weight")
            q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, self.nh, self.hd)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, self.nkv, self.hd)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, self.nkv, self.hd)
            q = self.norm(q, p + "self_attn.q_norm.weight")
            k = self.norm(k, p + "self_attn.k_norm.weight")
            q = rope(q, pos, self.inv[kind])
            k = rope(k, pos, self.inv[kind])
            K = self.K[l] = np.concatenate([self.K[l], k])
            V = self.V[l] = np.concatenate([self.V[l], v])
            kpos = np.arange(K.shape[0])
            att = np.einsum("thd,shd->hts", q, np.repeat(K, g, axis=1)) * self.scale
            dist = pos[:, None] - kpos[None, :]
            masked = dist < 0
            if kind == SLIDING:
                masked |= dist >= self.window
            att = softmax(att, masked[None])
            o = np.einsum("hts,shd->thd", att, np.repeat(V, g, axis=1)).reshape(T, self.nh * self.hd)
            o = o @ w[p + "self_attn.o_proj.weight"].T
            x = x + self.norm(o, p + "post_attention_layernorm.weight")
            h = self.norm(x, p + "pre_feedforward_layernorm.weight")
            m = gelu_tanh(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
            m = m @ w[p + "mlp.down_proj.weight"].T
            x = x + self.norm(m, p + "post_feedforward_layernorm.weight")
        x = self.norm(x, "model.norm.weight")
        logits = x @ self.lm_head.T
        if self.softcap:
            logits = self.softcap * np.tanh(logits / self.softcap)
        return logits

