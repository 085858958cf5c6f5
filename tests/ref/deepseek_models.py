"""Tiny random DeepSeek V2 / V3 / Kimi-K2 / Kimi-K2.5 checkpoints written with numpy: Hugging
Face folders (config.json as the hub files and transformers 5 write them, model.safetensors
in F32 or BF16 with e_score_correction_bias kept in F32, the tiny Gemma-style tokenizer of
tiny_tokenizer.py so kaon can tokenize) and GGUF `deepseek2` files in llama.cpp's current
layout (attn_k_b + attn_v_b, MQA metadata) and in the older one (attn_kv_b, MHA metadata). The
model math is in deepseek_ref.py.

GGUF layout facts (llama.cpp = ggml-org/llama.cpp: the converter's DeepseekV2Model class,
now conversion/deepseek.py, formerly convert_hf_to_gguf.py; TextModel.set_gguf_parameters in
the converter's base; src/models/deepseek2.cpp (llama_model_deepseek2::load_arch_hparams /
load_arch_tensors / the graph); src/llama-graph.cpp build_moe_ffn; src/llama-context.cpp
YaRN attn factor; gguf-py 0.19.0 constants.py MODEL_TENSORS[DEEPSEEK2], read here):

 arch "deepseek2" for DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, KimiVLForConditional-
 Generation, KimiK25ForConditionalGeneration (one converter class). Numpy shapes below are
 [rows, cols] = ggml ne reversed; HF [out, in] matrices are stored unchanged.
   token_embd.weight [V, d]; output_norm.weight [d]; output.weight [V, d] (skipped only when
     tie_word_embeddings is true)
   blk.N.attn_norm.weight [d]                      input_layernorm
   blk.N.attn_q.weight [H*(nope+rope), d]          q_proj (q_lora_rank null: V2-Lite)
   blk.N.attn_q_a.weight [q_lora, d]               q_a_proj
   blk.N.attn_q_a_norm.weight [q_lora]             q_a_layernorm
   blk.N.attn_q_b.weight [H*(nope+rope), q_lora]   q_b_proj
   blk.N.attn_kv_a_mqa.weight [kv_lora+rope, d]    kv_a_proj_with_mqa
   blk.N.attn_kv_a_norm.weight [kv_lora]           kv_a_layernorm
   current: kv_b_proj viewed [H, nope+v, kv_lora], split into
     blk.N.attn_k_b.weight [H, kv_lora, nope]      k part TRANSPOSED per head (ne {nope, kv_lora, H})
     blk.N.attn_v_b.weight [H, v, kv_lora]         v part as is            (ne {kv_lora, v, H})
   older files: blk.N.attn_kv_b.weight [H*(nope+v), kv_lora]   kv_b_proj unchanged
   blk.N.attn_output.weight [d, H*v]               o_proj
   blk.N.ffn_norm.weight [d]                       post_attention_layernorm
   dense layers (N < leading_dense_block_count): blk.N.ffn_gate/ffn_up.weight [F, d],
     ffn_down.weight [d, F]
   MoE layers: blk.N.ffn_gate_inp.weight [E, d] (mlp.gate.weight);
     blk.N.exp_probs_b.bias [E] (mlp.gate.e_score_correction_bias; optional);
     blk.N.ffn_gate_exps.weight / ffn_up_exps.weight [E, Fe, d], ffn_down_exps.weight
     [E, d, Fe] (the experts stacked in expert order); blk.N.ffn_gate_shexp / ffn_up_shexp
     [Fe*n_shared, d], ffn_down_shexp [d, Fe*n_shared].
   No norm offsets, no q/k row permutation (rope type NORM = adjacent pairs, as HF's
   interleaved MLA rope). MTP layers (index >= num_hidden_layers) are skipped.
 Metadata (deepseek2.*): context_length, embedding_length, block_count, feed_forward_length
   (dense intermediate_size), attention.head_count H, attention.head_count_kv = 1 in current
   files (the converter sets num_key_value_heads = 1: MLA as MQA) / H in older ones,
   rope.freq_base, attention.layer_norm_rms_epsilon, expert_count, expert_used_count,
   expert_group_count (n_group) and expert_group_used_count (topk_group) when the config has
   them, expert_gating_func (1 softmax, 2 sigmoid, from scoring_func; older V2 files lack it
   and llama.cpp then defaults to softmax), vocab_size, attention.q_lora_rank (absent when
   null), attention.kv_lora_rank, attention.key_length = kv_lora+rope and value_length =
   kv_lora in current files (nope+rope and v in older ones), attention.key_length_mla =
   nope+rope and value_length_mla = v (current files only; llama.cpp's is_mla() = both
   present), expert_feed_forward_length, expert_shared_count, expert_weights_scale
   (routed_scaling_factor), expert_weights_norm (written only when norm_topk_prob is true),
   rope.dimension_count = qk_rope_head_dim, leading_dense_block_count, rope.scaling.type
   "yarn", rope.scaling.factor, rope.scaling.original_context_length,
   rope.scaling.yarn_beta_fast / yarn_beta_slow (when in the config),
   rope.scaling.yarn_log_multiplier = 0.1 * mscale_all_dim (llama.cpp divides it by 0.1
   again on load: TAG_DEEPSEEK2_YARN_LOG_MUL_FIX), general.file_type.
 What llama.cpp does with them: kq_scale = mscale^2 / sqrt(key_length_mla) with mscale =
   1 + 0.1 * mscale_all_dim * ln(factor) (equal to transformers' scaling when mscale ==
   mscale_all_dim; llama.cpp has no key for mscale); the rope's own YaRN magnitude factor
   cancels to 1 for deepseek2 (llama-context.cpp special case), as transformers'
   attention_factor when mscale == mscale_all_dim. yarn_beta_fast / yarn_beta_slow are
   written by the converter, but llama_model_deepseek2::load_arch_hparams does not read them
   (only a few archs' loaders do; the context default is 32 / 1), so llama.cpp runs a Kimi-K2
   GGUF (1 / 1 in its config) with other frequencies than transformers; kaon should read them
   (default 32 / 1), and the kimi-k2 GGUF here checks that.
 Routing (build_moe_ffn): probs = softmax or sigmoid of the router logits; exp_probs_b added for selection only; with
   expert_group_count > 1 the group score is ALWAYS the sum of the top 2 (the V3 rule; there
   is no key for V2's topk_method, so a group_limited_greedy V2 file routes by top-2 sums in
   llama.cpp, not by the group max as transformers does); masked groups -inf; weights from the
   unbiased probs, normalised if expert_weights_norm, times expert_weights_scale.
 So a GGUF can only carry a model whose transformers math is llama.cpp's: no
 group_limited_greedy, mscale == mscale_all_dim, rms_norm_eps == 1e-6 (transformers keeps the
 latent norms at 1e-6, llama.cpp uses rms_norm_eps), no attention_factor. GGUF_CONFIGS lists
 those. (llama.cpp also decides "lite" = no q_lora by n_layer in {26, 27, 48 with a 128256
 vocab}; kaon should decide it by attn_q vs attn_q_a.)
"""
import json
from pathlib import Path

import numpy as np

import bf16
import gguf_files
from deepseek_ref import F32_KEEP, canonical_weights, kv_elements_per_token, rope_params, text_config, variant
from hf_files import TORCH_DTYPE, write_folder
from tiny_tokenizer import add_to_gguf

REAL_CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "configs"  # copies of shared/configs

# ---- configurations -----------------------------------------------------------------------

# Shapes chosen so that no two MLA widths coincide (a swapped dimension cannot go unnoticed):
# hidden 64, 4 heads, qk_nope 24, qk_rope 32 (16 RoPE pairs), v_head 20, kv_lora 40,
# q_lora 28; 16 routed experts of width 24; dense width 96. KV cache: 40 + 32 = 72 per layer.
# YaRN with original_max_position_embeddings 32: the 72-token test prompts run past it, and
# 32 RoPE dims give a ramp with extrapolated, blended and interpolated frequencies.
_HUB = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 24,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
    "n_shared_experts": 1, "n_routed_experts": 16, "num_experts_per_tok": 4,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 40, "q_lora_rank": 28, "qk_rope_head_dim": 32,
    "v_head_dim": 20, "qk_nope_head_dim": 24, "n_group": 4, "topk_group": 2,
    "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "hidden_act": "silu",
    "max_position_embeddings": 1280, "initializer_range": 0.02, "rms_norm_eps": 1e-6,
    "use_cache": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
    "tie_word_embeddings": False, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 32, "type": "yarn"},
    "attention_bias": False, "attention_dropout": 0.0, "ep_size": 1, "num_nextn_predict_layers": 0,
}
_V2 = dict(_HUB, architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", topk_method="greedy",
           scoring_func="softmax", norm_topk_prob=False, n_group=1, topk_group=1, aux_loss_alpha=0.001,
           seq_aux=True, pretraining_tp=1)

CONFIGS = {
    # DeepSeek-V2 with a q LoRA, softmax greedy top-4 of 16, routed scale 2 (not 1), one shared
    # expert; YaRN with mscale = mscale_all_dim = 0.707 (as V2 ships) and beta_fast 2, whose
    # ramp starts above dim 0 (low 1, high 3: pair 1 extrapolated, pair 2 blended).
    "v2": dict(_V2, routed_scaling_factor=2.0, max_position_embeddings=128,
               rope_scaling={"beta_fast": 2, "beta_slow": 1, "factor": 4, "mscale": 0.707, "mscale_all_dim": 0.707,
                             "original_max_position_embeddings": 32, "type": "yarn"}),
    # DeepSeek-V2's router (group_limited_greedy, n_group 4 / topk_group 2, routed scale 16 as
    # the 236B) with 2 shared experts, written in the transformers 5 form (rope_parameters,
    # dtype, head_dim = qk_rope_head_dim) with transformers 5's fused experts; mscale 1.0 vs
    # mscale_all_dim 0.8, so YaRN's attention factor (0.1 ln f + 1 ratio) scales cos and sin.
    # HF only: llama.cpp has neither the group max rule nor a key for mscale.
    "v2-group": dict(_V2, topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=16.0,
                     n_shared_experts=2, max_position_embeddings=256,
                     rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 8, "mscale": 1.0, "mscale_all_dim": 0.8,
                                   "original_max_position_embeddings": 32, "type": "yarn"}),
    # The V2-Lite shape: no q LoRA (q_proj), first_k_dense_replace 1, 2 shared experts,
    # norm_topk_prob false, routed scale 1.0, softmax greedy top-6, n_group = topk_group = 1,
    # YaRN factor 40 with mscale = mscale_all_dim = 0.707 (the real config's values).
    "v2-lite": dict(_V2, q_lora_rank=None, n_shared_experts=2, num_experts_per_tok=6, routed_scaling_factor=1.0,
                    rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                                  "mscale_all_dim": 0.707, "original_max_position_embeddings": 32, "type": "yarn"}),
    # DeepSeek-V3: sigmoid + e_score_correction_bias + noaux_tc, 4 groups of 4 with 2 kept,
    # top-4, norm_topk_prob true, routed scale 2.5, 2 leading dense layers of 4, and an MTP
    # layer's tensors in the checkpoint (num_nextn_predict_layers 1: layer 4, not run).
    "v3": dict(_HUB, num_hidden_layers=4, first_k_dense_replace=2, num_nextn_predict_layers=1),
    # Kimi-K2-Instruct's routing: model_type kimi_k2 on DeepseekV3ForCausalLM, n_group 1,
    # 12 experts, routed scale 2.827, rope theta 50000, YaRN factor 32 with beta_fast =
    # beta_slow = 1 (a step, not a ramp).
    "kimi-k2": dict(_HUB, model_type="kimi_k2", n_group=1, topk_group=1, n_routed_experts=12,
                    routed_scaling_factor=2.827, rope_theta=50000.0, max_position_embeddings=1024,
                    rope_scaling={"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                  "original_max_position_embeddings": 32, "type": "yarn"},
                    aux_loss_alpha=0.001, seq_aux=True, pretraining_tp=1),
}
# Kimi-K2.5: KimiK25ForConditionalGeneration whose language model is in text_config (kimi_k2,
# DeepseekV3ForCausalLM), rms_norm_eps 1e-5, YaRN factor 64 / beta_fast 32; weights under
# language_model.*, plus a few vision_tower / mm_projector tensors a text engine skips. Its
# q_a projection and kv_a's latent rows are small (x 0.01), so the latent norms' eps (1e-6 in transformers,
# not rms_norm_eps) changes the logits by far more than the tolerance.
_K25_TEXT = dict(CONFIGS["kimi-k2"], rms_norm_eps=1e-5, max_position_embeddings=2048,
                 rope_scaling={"beta_fast": 32.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                               "original_max_position_embeddings": 32, "type": "yarn"}, dtype="bfloat16")
CONFIGS["kimi-k25"] = {
    "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
    "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                 "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
                 "AutoModelForCausalLM": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
    "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "dtype": "bfloat16", "ignore_index": -100,
    "media_placeholder_token_id": 299, "tie_word_embeddings": False, "use_unified_vision_chunk": True,
    "video_placeholder": "<|kimi_k25_video_placeholder|>",
    "text_config": dict(_K25_TEXT, auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                                             "AutoModel": "modeling_deepseek.DeepseekV3Model",
                                             "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}),
    "vision_config": {"init_pos_emb_height": 4, "init_pos_emb_width": 4, "merge_kernel_size": [2, 2],
                      "mm_hidden_size": 16, "mm_projector_type": "patchmerger", "patch_size": 14,
                      "pos_emb_type": "divided_fixed", "projector_hidden_act": "gelu", "projector_ln_eps": 1e-05,
                      "text_hidden_size": 64, "vt_hidden_size": 16, "vt_intermediate_size": 32,
                      "vt_num_attention_heads": 2, "vt_num_hidden_layers": 1},
}
# The variants whose transformers math a GGUF file can carry (see the top of the file), and
# those also written in llama.cpp's older attn_kv_b layout (v2-lite: also without
# expert_gating_func, which older V2 files lack).
GGUF_CONFIGS = ["v2", "v2-lite", "v3", "kimi-k2"]
GGUF_OLD_CONFIGS = ["v2-lite", "v3"]
# config.json form of each variant: "hub" (rope_scaling + rope_theta + torch_dtype, as the
# released checkpoints) or "5" (what transformers 5.17 saves, as seen: rope_parameters holding
# rope_theta, rope_type and the hub's "type", dtype, head_dim = qk_rope_head_dim, qk_head_dim,
# rope_interleave for V3; the other keys as in the hub form).
FORMS = {"v2-group": "5"}
FUSED = {"v2-group"}  # experts as transformers 5 holds them (experts.gate_up_proj / down_proj)


def make_config(name):
    return json.loads(json.dumps(CONFIGS[name]))


def config_json(cfg, form="hub", dtype="float32"):
    """cfg (hub form, our canonical dict) as a config.json: "hub" or "5" (transformers 5)."""
    c = json.loads(json.dumps(cfg))
    t = text_config(c)
    if form == "hub":
        if "text_config" in c:
            c["dtype"] = t["dtype"] = dtype
        else:
            c.update(torch_dtype=dtype, transformers_version="4.46.3")
        return c
    if form != "5":
        raise ValueError(form)
    rp = rope_params(c)
    if "type" in (t.get("rope_scaling") or {}):  # kept beside rope_type when a hub config is re-saved
        rp["type"] = rp["rope_type"]
    for k in ("rope_scaling", "rope_theta"):
        t.pop(k, None)
    t.update(rope_parameters=rp, dtype=dtype, head_dim=t["qk_rope_head_dim"],
             qk_head_dim=t["qk_nope_head_dim"] + t["qk_rope_head_dim"], transformers_version="5.17.0")
    if variant(c) == "v3":
        t.setdefault("rope_interleave", True)
    return c


# ---- weights ------------------------------------------------------------------------------

def make_weights(cfg, seed=0):
    """Random weights in HF names (per-expert, as hub checkpoints and save_pretrained have
    them). Norm weights 1 + 0.4 N(0,1) (the model multiplies by w). Router logits of a few
    units (3 / sqrt(d) rows); e_score_correction_bias uniform in [0, 0.3): positive, so
    transformers 4.x's 0.0 group masking and 5.x's -inf agree, and large enough against the
    sigmoid scores to change many expert choices."""
    rng = np.random.default_rng(seed)
    c = text_config(cfg)
    d, F, Fe, V = c["hidden_size"], c["intermediate_size"], c["moe_intermediate_size"], c["vocab_size"]
    H, nope, rd, vd = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    kvr, qr, E = c["kv_lora_rank"], c.get("q_lora_rank"), c["n_routed_experts"]
    small = 0.01 if "text_config" in cfg else 1.0  # Kimi-K2.5: latent norms' eps matters

    def mat(o, i, scale=1.0):
        return (scale * rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.4 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": rng.standard_normal((V, d)).astype(np.float32),
         "model.norm.weight": norm(d), "lm_head.weight": mat(V, d)}

    def layer(l, moe):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = norm(d)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        a = p + "self_attn."
        if qr is None:
            w[a + "q_proj.weight"] = mat(H * (nope + rd), d)
        else:
            w[a + "q_a_proj.weight"] = mat(qr, d, small)
            w[a + "q_a_layernorm.weight"] = norm(qr)
            w[a + "q_b_proj.weight"] = mat(H * (nope + rd), qr)
        w[a + "kv_a_proj_with_mqa.weight"] = np.concatenate([mat(kvr, d, small), mat(rd, d)])  # latent | k_pe rows
        w[a + "kv_a_layernorm.weight"] = norm(kvr)
        w[a + "kv_b_proj.weight"] = mat(H * (nope + vd), kvr)
        w[a + "o_proj.weight"] = mat(d, H * vd)
        m = p + "mlp."
        if not moe:
            w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"] = mat(F, d), mat(F, d), mat(d, F)
            return
        w[m + "gate.weight"] = mat(E, d, 3.0)
        if variant(cfg) == "v3":
            w[m + "gate.e_score_correction_bias"] = rng.uniform(0.0, 0.3, E).astype(np.float32)
        for e in range(E):
            q = f"{m}experts.{e}."
            w[q + "gate_proj.weight"], w[q + "up_proj.weight"], w[q + "down_proj.weight"] = mat(Fe, d), mat(Fe, d), mat(d, Fe)
        Fs = Fe * c["n_shared_experts"]
        q = m + "shared_experts."
        w[q + "gate_proj.weight"], w[q + "up_proj.weight"], w[q + "down_proj.weight"] = mat(Fs, d), mat(Fs, d), mat(d, Fs)

    L = c["num_hidden_layers"]
    for l in range(L):
        layer(l, l >= c.get("first_k_dense_replace", 0))
    for l in range(L, L + (c.get("num_nextn_predict_layers") or 0)):  # MTP: not run by the main model
        layer(l, True)
        p = f"model.layers.{l}."
        w[p + "enorm.weight"], w[p + "hnorm.weight"] = norm(d), norm(d)
        w[p + "eh_proj.weight"] = mat(d, 2 * d)
        w[p + "shared_head.norm.weight"] = norm(d)
        w[p + "shared_head.head.weight"] = w["lm_head.weight"].copy()
        w[p + "embed_tokens.weight"] = w["model.embed_tokens.weight"].copy()
    if "text_config" in cfg:  # Kimi-K2.5: the checkpoint's names, and a vision part
        w = {"language_model." + k: v for k, v in w.items()}
        w["vision_tower.patch_embed.proj.weight"] = rng.standard_normal((16, 3, 14, 14)).astype(np.float32)
        w["vision_tower.encoder.blocks.0.wqkv.weight"] = mat(48, 16)
        w["mm_projector.proj.0.weight"] = mat(64, 64)
        w["mm_projector.proj.2.weight"] = mat(64, 64)
    return w


def round_bf16(w):
    """The values a BF16 checkpoint stores: everything rounded to bf16 except the tensors kept
    in f32 (e_score_correction_bias)."""
    return bf16.round_bf16(w, keep_f32=F32_KEEP)


def fuse_experts(w):
    """transformers 5's in-memory layout: mlp.experts.gate_up_proj [E, 2F, d] (gate rows
    first) and mlp.experts.down_proj [E, d, F]."""
    w = dict(w)
    layers = sorted({k.split(".experts.")[0] for k in w if ".mlp.experts." in k})
    for p in layers:
        E = 1 + max(int(k[len(p) + 9:].split(".")[0]) for k in w if k.startswith(p + ".experts."))
        g = [w.pop(f"{p}.experts.{e}.gate_proj.weight") for e in range(E)]
        u = [w.pop(f"{p}.experts.{e}.up_proj.weight") for e in range(E)]
        dn = [w.pop(f"{p}.experts.{e}.down_proj.weight") for e in range(E)]
        w[p + ".experts.gate_up_proj"] = np.stack([np.concatenate([a, b]) for a, b in zip(g, u)])
        w[p + ".experts.down_proj"] = np.stack(dn)
    return w


# ---- writers ------------------------------------------------------------------------------

def save_hf(folder, cfg, weights, dtype="F32", form="hub", fused=False, tokenizer=True):
    """An HF folder; in a BF16 checkpoint the F32_KEEP tensors stay F32, as HF saves them."""
    return write_folder(folder, config_json(cfg, form, TORCH_DTYPE[dtype]),
                        fuse_experts(weights) if fused else weights, dtype, keep_f32=F32_KEEP, tokenizer=tokenizer)


GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight", "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight", "self_attn.kv_b_proj.weight": "attn_kv_b.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}
EXPERT_NAMES = {"gate_proj": "ffn_gate_exps.weight", "up_proj": "ffn_up_exps.weight", "down_proj": "ffn_down_exps.weight"}


def save_gguf(path, cfg, weights, layout="split", tokenizer=True):
    """An F32 GGUF `deepseek2` file as llama.cpp's converter writes one. layout "split": the
    current attn_k_b / attn_v_b tensors and MQA metadata (head_count_kv 1, key_length
    kv_lora + rope, value_length kv_lora, key/value_length_mla); "kv_b": the older attn_kv_b
    and MHA metadata (head_count_kv H, key_length nope + rope, value_length v, no *_mla keys;
    a softmax model also without expert_gating_func)."""
    import gguf
    assert layout in ("split", "kv_b")
    c = text_config(cfg)
    kind = variant(cfg)
    rp = rope_params(cfg)
    assert not (kind == "v2" and c.get("topk_method", "greedy") != "greedy"), "llama.cpp groups by top-2 sums"
    assert c.get("rms_norm_eps", 1e-6) == 1e-6, "llama.cpp's latent norms use rms_norm_eps"
    assert rp["rope_type"] == "default" or (rp.get("mscale") == rp.get("mscale_all_dim") and "attention_factor" not in rp)
    w = canonical_weights(weights)
    L, H, d = c["num_hidden_layers"], c["num_attention_heads"], c["hidden_size"]
    nope, rd, vd, kvr = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    wr = gguf.GGUFWriter(str(path), "deepseek2")
    wr.add_name("tiny-deepseek2")
    wr.add_context_length(c["max_position_embeddings"])
    wr.add_embedding_length(d)
    wr.add_block_count(L)
    wr.add_feed_forward_length(c["intermediate_size"])
    wr.add_head_count(H)
    wr.add_head_count_kv(1 if layout == "split" else H)
    if rp["rope_type"] == "yarn":
        wr.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        wr.add_rope_scaling_factor(rp["factor"])
        wr.add_rope_scaling_orig_ctx_len(int(rp["original_max_position_embeddings"]))
        if rp.get("beta_fast") is not None:
            wr.add_rope_scaling_yarn_beta_fast(rp["beta_fast"])
        if rp.get("beta_slow") is not None:
            wr.add_rope_scaling_yarn_beta_slow(rp["beta_slow"])
    wr.add_rope_freq_base(rp["rope_theta"])
    wr.add_layer_norm_rms_eps(c["rms_norm_eps"])
    wr.add_expert_count(c["n_routed_experts"])
    wr.add_expert_used_count(c["num_experts_per_tok"])
    if c.get("n_group") is not None:
        wr.add_expert_group_count(c["n_group"])
    if c.get("topk_group") is not None:
        wr.add_expert_group_used_count(c["topk_group"])
    sf = c.get("scoring_func", "sigmoid" if kind == "v3" else "softmax")
    if not (layout == "kv_b" and sf == "softmax"):
        wr.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if sf == "sigmoid" else gguf.ExpertGatingFuncType.SOFTMAX)
    wr.add_file_type(gguf.LlamaFileType.ALL_F32)
    wr.add_leading_dense_block_count(c.get("first_k_dense_replace", 0))
    wr.add_vocab_size(c["vocab_size"])
    if c.get("q_lora_rank") is not None:
        wr.add_q_lora_rank(c["q_lora_rank"])
    wr.add_kv_lora_rank(kvr)
    if layout == "split":
        wr.add_key_length(kvr + rd)
        wr.add_value_length(kvr)
        wr.add_key_length_mla(nope + rd)
        wr.add_value_length_mla(vd)
    else:
        wr.add_key_length(nope + rd)
        wr.add_value_length(vd)
    wr.add_expert_feed_forward_length(c["moe_intermediate_size"])
    wr.add_expert_shared_count(c["n_shared_experts"])
    if c.get("routed_scaling_factor") is not None:
        wr.add_expert_weights_scale(float(c["routed_scaling_factor"]))
    if c.get("norm_topk_prob"):
        wr.add_expert_weights_norm(True)
    wr.add_rope_dimension_count(rd)
    if rp.get("mscale_all_dim") is not None:
        wr.add_rope_scaling_yarn_log_mul(0.1 * rp["mscale_all_dim"])
    if tokenizer:
        add_to_gguf(wr, c["vocab_size"])

    def add(name, a):
        wr.add_tensor(name, np.ascontiguousarray(a, np.float32))
    add("token_embd.weight", w["model.embed_tokens.weight"])
    add("output_norm.weight", w["model.norm.weight"])
    add("output.weight", w["lm_head.weight"])
    for l in range(L):
        p = f"model.layers.{l}."
        for hf, gg in GGUF_LAYER_NAMES.items():
            if p + hf not in w:
                continue
            a = w[p + hf]
            if hf == "self_attn.kv_b_proj.weight" and layout == "split":
                kvb = a.reshape(H, nope + vd, kvr)
                add(f"blk.{l}.attn_k_b.weight", kvb[:, :nope].transpose(0, 2, 1))   # [H, kv_lora, nope]
                add(f"blk.{l}.attn_v_b.weight", kvb[:, nope:])                      # [H, v, kv_lora]
                continue
            add(f"blk.{l}.{gg}", a)
        if l >= c.get("first_k_dense_replace", 0):
            for hf, gg in EXPERT_NAMES.items():
                add(f"blk.{l}.{gg}", np.stack([w[f"{p}mlp.experts.{e}.{hf}.weight"] for e in range(c["n_routed_experts"])]))
    gguf_files.write_out(wr)
    return Path(path)


def load_gguf(path):
    """Reads a `deepseek2` GGUF back by llama.cpp's rules (the spec kaon's loader follows):
    (config in our hub form, HF-named weights). Semantics from the metadata: softmax gating ->
    DeepSeek-V2 greedy (llama.cpp has no V2 group rule), sigmoid -> V3; the MLA head sizes
    from key_length_mla / value_length_mla when present (current files), else from
    key_length / value_length (older files); kv_b_proj rebuilt from attn_k_b + attn_v_b."""
    kv, top, blocks = gguf_files.read(path, "deepseek2")
    L, d, H = int(kv("block_count")), int(kv("embedding_length")), int(kv("attention.head_count"))
    kvr, rd = int(kv("attention.kv_lora_rank")), int(kv("rope.dimension_count"))
    mla = kv("attention.key_length_mla") is not None and kv("attention.value_length_mla") is not None
    qk = int(kv("attention.key_length_mla" if mla else "attention.key_length"))
    vd = int(kv("attention.value_length_mla" if mla else "attention.value_length"))
    if mla:
        assert int(kv("attention.key_length")) == kvr + rd and int(kv("attention.value_length")) == kvr
        assert int(kv("attention.head_count_kv")) == 1
    gating = int(kv("expert_gating_func", 1))  # llama.cpp: absent -> softmax (older V2 files)
    sigmoid = gating == 2
    n_group = kv("expert_group_count")
    cfg = {"architectures": ["DeepseekV3ForCausalLM" if sigmoid else "DeepseekV2ForCausalLM"],
           "model_type": "deepseek_v3" if sigmoid else "deepseek_v2",
           "hidden_size": d, "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": H,
           "intermediate_size": int(kv("feed_forward_length")), "max_position_embeddings": int(kv("context_length")),
           "rms_norm_eps": float(kv("attention.layer_norm_rms_epsilon")), "kv_lora_rank": kvr,
           "q_lora_rank": int(kv("attention.q_lora_rank")) if kv("attention.q_lora_rank") else None,
           "qk_rope_head_dim": rd, "qk_nope_head_dim": qk - rd, "v_head_dim": vd,
           "n_routed_experts": int(kv("expert_count")), "num_experts_per_tok": int(kv("expert_used_count")),
           "moe_intermediate_size": int(kv("expert_feed_forward_length")),
           "n_shared_experts": int(kv("expert_shared_count")),
           "first_k_dense_replace": int(kv("leading_dense_block_count", 0)),
           "routed_scaling_factor": float(kv("expert_weights_scale", 1.0)),
           "norm_topk_prob": bool(kv("expert_weights_norm", False)),
           "n_group": int(n_group) if n_group is not None else None,
           "topk_group": int(kv("expert_group_used_count")) if kv("expert_group_used_count") is not None else None,
           "scoring_func": "sigmoid" if sigmoid else "softmax", "topk_method": "noaux_tc" if sigmoid else "greedy",
           "hidden_act": "silu", "tie_word_embeddings": False, "rope_theta": float(kv("rope.freq_base", 10000.0))}
    if not sigmoid:
        assert (cfg["n_group"] or 1) == 1, "a softmax GGUF with groups has no transformers equivalent"
    if kv("rope.scaling.type") == "yarn":
        log_mul = kv("rope.scaling.yarn_log_multiplier")
        ms = float(log_mul) / 0.1 if log_mul is not None else None
        rs = {"type": "yarn", "factor": float(kv("rope.scaling.factor")),
              "original_max_position_embeddings": int(kv("rope.scaling.original_context_length"))}
        for k in ("beta_fast", "beta_slow"):
            if kv(f"rope.scaling.yarn_{k}") is not None:
                rs[k] = float(kv(f"rope.scaling.yarn_{k}"))
        if ms is not None:
            rs["mscale"] = rs["mscale_all_dim"] = ms
        cfg["rope_scaling"] = rs
    inv = {v.rsplit(".", 1)[0]: k for k, v in GGUF_LAYER_NAMES.items()}
    inv_exp = {v.rsplit(".", 1)[0]: k for k, v in EXPERT_NAMES.items()}
    cfg["vocab_size"] = top["model.embed_tokens.weight"].shape[0]
    w, kb, vb = dict(top), {}, {}
    for (l, kind), a in blocks.items():
        p = f"model.layers.{l}."
        if kind == "attn_k_b":
            kb[l] = a
        elif kind == "attn_v_b":
            vb[l] = a
        elif kind in inv_exp:
            for e in range(a.shape[0]):
                w[f"{p}mlp.experts.{e}.{inv_exp[kind]}.weight"] = a[e]
        else:
            w[p + inv[kind]] = a
    for l in kb:  # kv_b_proj rows per head: k_nope (k_b transposed back) then v
        w[f"model.layers.{l}.self_attn.kv_b_proj.weight"] = np.concatenate(
            [kb[l].transpose(0, 2, 1), vb[l]], axis=1).reshape(H * (qk - rd + vd), kvr)
    return cfg, w


def model_of(name, fmt, tmp, seed=None):
    """(model path, HF-named weights the reference must see, cfg) for one config and format:
    F32 / BF16 (safetensors) or GGUF (current layout) / GGUF-kv_b (older layout), F32."""
    cfg = make_config(name)
    w = make_weights(cfg, seed=list(CONFIGS).index(name) if seed is None else seed)
    if fmt == "BF16":
        w = round_bf16(w)
    tmp = Path(tmp)
    if fmt in ("GGUF", "GGUF-kv_b"):
        layout = "split" if fmt == "GGUF" else "kv_b"
        return save_gguf(tmp / f"deepseek-{name}-{layout}.gguf", cfg, w, layout), w, cfg
    return save_hf(tmp / f"deepseek-{name}-{fmt}", cfg, w, fmt, FORMS.get(name, "hub"), name in FUSED), w, cfg


def real_config(name):
    """A real configuration as config.json: the files of bench/configs (= shared/configs), and DeepSeek-V2-Lite
    from the values recorded in shared/configs/SOURCES.md (no copy of its config.json exists
    there; DeepSeek's own config_16B.json uses other field names)."""
    files = {"DeepSeek-V3": "deepseek-ai__DeepSeek-V3.json", "DeepSeek-R1": "deepseek-ai__DeepSeek-R1.json",
             "Kimi-K2-Instruct": "moonshotai__Kimi-K2-Instruct.json", "Kimi-K2.5": "moonshotai__Kimi-K2.5.json"}
    if name in files:
        return json.loads((REAL_CONFIGS / files[name]).read_text())
    assert name == "DeepSeek-V2-Lite", name
    return {"architectures": ["DeepseekV2ForCausalLM"], "aux_loss_alpha": 0.001, "bos_token_id": 100000,
            "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
            "initializer_range": 0.02, "intermediate_size": 10944, "kv_lora_rank": 512,
            "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
            "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2,
            "norm_topk_prob": False, "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
            "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
            "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                             "original_max_position_embeddings": 4096, "type": "yarn"},
            "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
            "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
            "use_cache": True, "v_head_dim": 128, "vocab_size": 102400}


def kv_bytes_per_token(cfg, elem_bytes):
    """MLA KV cache bytes per token: (kv_lora_rank + qk_rope_head_dim) x layers x element size
    (DeepSeek-V3 in bf16: 576 x 61 x 2 = 70272)."""
    return kv_elements_per_token(cfg) * text_config(cfg)["num_hidden_layers"] * elem_bytes
