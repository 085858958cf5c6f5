"""DeepSeek V2 / V3, Kimi-K2 and Kimi-K2.5 (src/model/deepseek2.c: MLA + DeepSeekMoE) on the
CPU against the numpy float64 reference (deepseek_ref.py): tiny random checkpoints
(deepseek_models.py) as HF folders in F32 and BF16 (hub and transformers 5 config forms,
per-expert and fused experts, Kimi-K2.5's nested text_config and language_model. names) and
as llama.cpp-style GGUF files in the current (attn_k_b / attn_v_b) and the older (attn_kv_b)
layout; prefill, decode (one token per step) and chunked prefill over 72-token prompts that run
past YaRN's original context; greedy ids through `kaon run`; the MLA KV bytes per token that
`kaon info` reports.

The reference is checked here against a second transcription of transformers 5.17's
modeling_deepseek_v2.py / modeling_deepseek_v3.py (hf_literal_forward: the torch code's shapes
and steps in float32 numpy), its naive MLA against its absorbed MLA, its prefill against its
decode, its routing for margins, and the GGUF files read back by llama.cpp's rules;
tests/gpu/test_deepseek_hf.py checks it against transformers itself.

Until kaon supports DeepSeek, the kaon tests FAIL (not skip) with kaon's own error message.
"""
import json
import math
import re
import subprocess
from functools import lru_cache, partial

import numpy as np
import pytest

import kaon_cli
from deepseek_models import (CONFIGS, GGUF_CONFIGS, GGUF_OLD_CONFIGS, config_json, fuse_experts,
                             kv_bytes_per_token, load_gguf, make_config, make_weights, model_of, real_config,
                             round_bf16)
from deepseek_ref import DeepseekRef, canonical_weights, rope_params, text_config, variant
from logit_checks import (assert_greedy_matches, assert_logits_match, assert_matches_transcription, greedy,
                          prefill_and_decode, rel_err)

# 72 ids: every region of the vocabulary (specials, byte tokens, pieces), repeats, and more
# than twice YaRN's original_max_position_embeddings (32) of the tiny configs.
IDS = [2, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13, 8, 150, 77, 31,
       270, 263, 1, 280, 101, 102, 33, 33, 33, 290, 6, 261, 262, 180, 44, 9, 298, 141, 66, 271,
       19, 88, 230, 4, 275, 55, 55, 112, 160, 293, 28, 71, 266, 190, 12, 39, 243, 285, 97, 14,
       130, 57, 269, 21, 147, 81, 45, 222, 16, 276, 93, 58]
TOL = {"F32": 1e-4, "BF16": 1e-2, "GGUF": 1e-4, "GGUF-kv_b": 1e-4}
CASES = ([(n, f) for n in CONFIGS for f in ("F32", "BF16")] + [(n, "GGUF") for n in GGUF_CONFIGS]
         + [(n, "GGUF-kv_b") for n in GGUF_OLD_CONFIGS])


@lru_cache(maxsize=None)
def reference_logits(name, bf16):
    """The reference's logits of IDS for one variant (F32 and GGUF files hold the same values)."""
    cfg = make_config(name)
    w = make_weights(cfg, seed=list(CONFIGS).index(name))
    ref = DeepseekRef(cfg, round_bf16(w) if bf16 else w)
    out = ref.forward(IDS)
    return out, ref.min_margin


NOT_YET = kaon_cli.NotYet("kaon does not run DeepSeek yet (src/model/deepseek2.c)",
                          ("unsupported architecture", "not supported"))
kaon_logits = partial(kaon_cli.logits, not_yet=NOT_YET)
kaon_greedy = partial(kaon_cli.greedy, not_yet=NOT_YET)


# ---- the reference against a literal transcription of transformers' code -------------------

def hf_literal_forward(cfg, w, ids):
    """transformers 5.17's DeepseekV2ForCausalLM / DeepseekV3ForCausalLM.forward (eager
    attention, no cache, batch 1) step by step in float32 numpy: the config's __post_init__ and
    convert_rope_params_to_dict / standardize_rope_params, _compute_yarn_parameters,
    DeepseekV{2,3}RotaryEmbedding, RMSNorm, Attention (q LoRA or q_proj, kv_a split,
    kv_a_layernorm, apply_rotary_emb (V2, complex) or apply_rotary_pos_emb_interleave /
    apply_rotary_pos_emb (V3), expand_kv, eager_attention_forward with create_causal_mask,
    yarn_apply_mscale), TopkRouter, Experts (fused gate_up_proj / down_proj), MoE with
    shared_experts, MLP, DecoderLayer, model.norm, lm_head."""
    f32 = np.float32
    c = dict(text_config(cfg))
    V3 = variant(cfg) == "v3"
    W = {k: np.asarray(v, f32) for k, v in canonical_weights(w).items()}
    # __post_init__ / convert_rope_params_to_dict: rope_scaling (hub) -> rope_parameters
    rp = dict(c.get("rope_scaling") or c.get("rope_parameters") or {})
    rp.setdefault("rope_theta", c.get("rope_theta", 10000.0))
    rp.setdefault("rope_type", rp.get("type", "default"))
    if rp["rope_type"] in ("llama3", "yarn", "longrope"):
        rp.setdefault("original_max_position_embeddings", c["max_position_embeddings"])
    for key in ("beta_fast", "beta_slow", "factor"):
        if key in rp:
            rp[key] = float(rp[key])
    nope, rdim, vdim = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    kv_lora, q_lora = c["kv_lora_rank"], c.get("q_lora_rank")
    qk_head_dim, head_dim = nope + rdim, rdim
    eps = c.get("rms_norm_eps", 1e-6)
    E, top_k = c["n_routed_experts"], c["num_experts_per_tok"]
    n_group = c.get("n_group")
    topk_group = c.get("topk_group")

    def rms_norm(x, weight, e=1e-6):  # DeepseekV2RMSNorm / DeepseekV3RMSNorm
        xf = x.astype(f32)
        var = (xf ** 2).mean(-1, keepdims=True)
        xf = xf * (1.0 / np.sqrt(var + f32(e))).astype(f32)
        return weight * xf.astype(x.dtype)

    def rope_init():  # compute_default_rope_parameters / _compute_yarn_parameters
        base = rp["rope_theta"]
        dim = head_dim
        pos_freqs = (f32(base) ** (np.arange(0, dim, 2).astype(f32) / f32(dim))).astype(f32)
        if rp["rope_type"] == "default":
            return (f32(1.0) / pos_freqs).astype(f32), 1.0
        factor = rp["factor"]
        attention_factor = rp.get("attention_factor")
        mscale, mscale_all_dim = rp.get("mscale"), rp.get("mscale_all_dim")
        L0 = rp["original_max_position_embeddings"]
        if factor is None:
            factor = c["max_position_embeddings"] / L0

        def get_mscale(scale, m=1):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
        if attention_factor is None:
            if mscale and mscale_all_dim:
                attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
            else:
                attention_factor = get_mscale(factor)
        beta_fast = rp.get("beta_fast") or 32
        beta_slow = rp.get("beta_slow") or 1

        def find_correction_dim(num_rotations):
            return (dim * math.log(L0 / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

        def find_correction_range(low_rot, high_rot, truncate):
            low = find_correction_dim(low_rot)
            high = find_correction_dim(high_rot)
            if truncate:
                low = math.floor(low)
                high = math.ceil(high)
            return max(low, 0), min(high, dim - 1)

        def linear_ramp_factor(lo, hi, n):
            if lo == hi:
                hi += 0.001  # prevent singularity
            return np.clip((np.arange(n, dtype=f32) - f32(lo)) / f32(hi - lo), 0, 1).astype(f32)
        low, high = find_correction_range(beta_fast, beta_slow, rp.get("truncate", True))
        ramp = linear_ramp_factor(low, high, dim // 2)
        extrap = (f32(1.0) / pos_freqs).astype(f32)
        interp = (f32(1.0) / (f32(factor) * pos_freqs)).astype(f32)
        extrap_factor = (f32(1) - ramp).astype(f32)
        return (interp * (f32(1) - extrap_factor) + extrap * extrap_factor).astype(f32), attention_factor

    def scaling():  # yarn_apply_mscale
        s = qk_head_dim ** (-0.5)
        if rp.get("rope_type", "default") != "default":
            msa = rp.get("mscale_all_dim", 0)
            if msa:
                m = 0.1 * msa * math.log(rp["factor"]) + 1.0 if rp["factor"] > 1 else 1.0
                s = s * m * m
        return s

    T = len(ids)
    position_ids = np.arange(T)
    inv_freq, attention_scaling = rope_init()
    freqs = (inv_freq[:, None] @ position_ids[None, :].astype(f32)).T.astype(f32)  # [T, rd/2]
    if V3:
        emb = np.concatenate([freqs, freqs], -1)
        cos = (np.cos(emb) * f32(attention_scaling)).astype(f32)
        sin = (np.sin(emb) * f32(attention_scaling)).astype(f32)
    else:
        freqs_cis = (np.exp(1j * freqs.astype(np.float64)) * attention_scaling).astype(np.complex64)

    def rotate_half(x):
        return np.concatenate([-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]], -1)

    def apply_rope(x):  # x [heads, T, rd]
        if not V3:  # apply_rotary_emb: view_as_complex over (2i, 2i+1)
            xc = x.astype(f32).reshape(*x.shape[:-1], -1, 2)
            xc = (xc[..., 0] + 1j * xc[..., 1]).astype(np.complex64) * freqs_cis[None]
            return np.stack([xc.real, xc.imag], -1).reshape(x.shape).astype(f32)
        if c.get("rope_interleave", True):  # apply_rotary_pos_emb_interleave
            cs, sn = cos[..., : cos.shape[-1] // 2][None], sin[..., : sin.shape[-1] // 2][None]
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return np.concatenate([x1 * cs - x2 * sn, x2 * cs + x1 * sn], -1)
        return x * cos[None] + rotate_half(x) * sin[None]  # apply_rotary_pos_emb

    mask = np.where(np.arange(T)[None, :] <= np.arange(T)[:, None], f32(0), np.finfo(f32).min)[None]

    def attention(p, h):
        if q_lora is None:
            q = h @ W[p + "q_proj.weight"].T
        else:
            q = rms_norm(h @ W[p + "q_a_proj.weight"].T, W[p + "q_a_layernorm.weight"]) @ W[p + "q_b_proj.weight"].T
        q = q.reshape(T, -1, qk_head_dim).transpose(1, 0, 2)  # [H, T, qk]
        q_pass, q_rot = q[..., :nope], q[..., nope:]
        compressed = h @ W[p + "kv_a_proj_with_mqa.weight"].T
        kv_nope, k_rot = compressed[:, :kv_lora], compressed[:, kv_lora:]
        kv_nope = rms_norm(kv_nope, W[p + "kv_a_layernorm.weight"])[None]  # [1, T, kv_lora]
        k_rot = k_rot[None]  # [1, T, rd]
        q_rot, k_rot = apply_rope(q_rot), apply_rope(k_rot)
        query = np.concatenate([q_pass, q_rot], -1)
        kv = (kv_nope @ W[p + "kv_b_proj.weight"].T)[0].reshape(T, -1, nope + vdim).transpose(1, 0, 2)
        k_nope, value = kv[..., :nope], kv[..., nope:]
        key = np.concatenate([k_nope, np.broadcast_to(k_rot, (k_nope.shape[0], T, rdim))], -1)
        attn = (query @ key.transpose(0, 2, 1)) * f32(scaling()) + mask
        attn = np.exp(attn - attn.max(-1, keepdims=True))
        attn = (attn / attn.sum(-1, keepdims=True)).astype(f32)
        o = (attn @ value).transpose(1, 0, 2).reshape(T, -1)
        return o @ W[p + "o_proj.weight"].T

    def silu(x):
        return x / (f32(1) + np.exp(-x))

    def mlp(p, x):  # DeepseekV{2,3}MLP
        return (silu(x @ W[p + "gate_proj.weight"].T) * (x @ W[p + "up_proj.weight"].T)) @ W[p + "down_proj.weight"].T

    def topk_idx(a, k):
        return np.argsort(-a, -1, kind="stable")[:, :k]

    def router(p, h):
        logits = h.astype(f32) @ W[p + "gate.weight"].astype(f32).T
        if V3:  # DeepseekV3TopkRouter.forward
            scores = (f32(1) / (f32(1) + np.exp(-logits))).astype(f32)
            choice = scores + W[p + "gate.e_score_correction_bias"]
            group_scores = np.sort(choice.reshape(-1, n_group, E // n_group), -1)[..., -2:].sum(-1)
            group_idx = topk_idx(group_scores, topk_group)
            group_mask = np.zeros_like(group_scores)
            np.put_along_axis(group_mask, group_idx, 1, 1)
            score_mask = np.repeat(group_mask, E // n_group, axis=1)
            choice = np.where(score_mask.astype(bool), choice, -np.inf)
            idx = topk_idx(choice, top_k)
            wts = np.take_along_axis(scores, idx, 1)
            if c.get("norm_topk_prob", True):
                wts = wts / (wts.sum(-1, keepdims=True) + f32(1e-20))
            return idx, wts * f32(c.get("routed_scaling_factor", 2.5))
        ex = np.exp(logits - logits.max(-1, keepdims=True))  # DeepseekV2TopkRouter.forward
        scores = (ex / ex.sum(-1, keepdims=True)).astype(f32)
        if c.get("topk_method", "greedy") == "group_limited_greedy":
            group_scores = scores.reshape(-1, n_group, E // n_group).max(-1)
            group_idx = topk_idx(group_scores, topk_group)
            group_mask = np.zeros_like(group_scores)
            np.put_along_axis(group_mask, group_idx, 1, 1)
            scores = np.where(np.repeat(group_mask, E // n_group, axis=1).astype(bool), scores, f32(0.0))
        idx = topk_idx(scores, top_k)
        return idx, np.take_along_axis(scores, idx, 1) * f32(c.get("routed_scaling_factor", 1.0))

    def moe(p, h):
        idx, wts = router(p, h)
        # DeepseekV{2,3}Experts: the fused parameters, one expert at a time, index_add
        gate_up = np.stack([np.concatenate([W[f"{p}experts.{e}.gate_proj.weight"], W[f"{p}experts.{e}.up_proj.weight"]])
                            for e in range(E)])
        down = np.stack([W[f"{p}experts.{e}.down_proj.weight"] for e in range(E)])
        final = np.zeros_like(h)
        for e in range(E):
            token_idx, top_k_pos = np.nonzero(idx == e)
            if token_idx.size == 0:
                continue
            gu = h[token_idx] @ gate_up[e].T
            g, u = gu[:, : gu.shape[1] // 2], gu[:, gu.shape[1] // 2:]
            cur = (silu(g) * u) @ down[e].T
            np.add.at(final, token_idx, cur * wts[token_idx, top_k_pos][:, None])
        return final + mlp(p + "shared_experts.", h)

    x = W["model.embed_tokens.weight"][np.asarray(ids)]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        x = x + attention(p + "self_attn.", rms_norm(x, W[p + "input_layernorm.weight"], eps))
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        x = x + (moe(p + "mlp.", h) if l >= c.get("first_k_dense_replace", 0 if not V3 else 3) else mlp(p + "mlp.", h))
    x = rms_norm(x, W["model.norm.weight"], eps)
    return x @ W["lm_head.weight"].T


def _with(name, **kw):
    cfg = make_config(name)
    text_config(cfg).update(kw)
    return cfg


# Reference-only variants: V3 with rope_interleave false (rotate_half on the rope dims), and
# an explicit YaRN attention_factor.
EXTRA = {"v3-neox": lambda: _with("v3", rope_interleave=False),
         "v3-attn-factor": lambda: _with("v3", rope_scaling=dict(make_config("v3")["rope_scaling"], attention_factor=0.9))}


@pytest.mark.parametrize("name", list(CONFIGS) + list(EXTRA))
def test_reference_equals_literal_transcription(name):
    cfg = EXTRA[name]() if name in EXTRA else make_config(name)
    w = make_weights(cfg, seed=11)
    assert_matches_transcription(hf_literal_forward(cfg, w, IDS), DeepseekRef(cfg, w).forward(IDS), name)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_naive_mla_equals_absorbed(name):
    """Expanding k/v per head from the latent cache and attending over the latent with W_UK in
    q and W_UV after the softmax are the same function."""
    cfg = make_config(name)
    w = make_weights(cfg, seed=7)
    a = DeepseekRef(cfg, w, mla="naive").forward(IDS)
    b = DeepseekRef(cfg, w, mla="absorbed").forward(IDS)
    assert np.abs(a - b).max() < 1e-10 * max(1.0, np.abs(a).max())


@pytest.mark.parametrize("name", ["v2-lite", "v3"])
def test_reference_prefill_equals_decode(name):
    cfg = make_config(name)
    a, b = prefill_and_decode(DeepseekRef(cfg, make_weights(cfg, seed=3), mla="absorbed"), IDS)
    assert np.abs(a - b).max() < 1e-10


@pytest.mark.parametrize("name", list(CONFIGS))
def test_routing_is_clear_and_bias_matters(name):
    """No routing decision of the test prompt sits near a tie (float32 cannot flip one), and
    for V3 routers e_score_correction_bias changes the chosen experts of many tokens."""
    cfg = make_config(name)
    for bf16 in (False, True):
        _, margin = reference_logits(name, bf16)
        assert margin > 1e-4, (bf16, margin)
    ref = DeepseekRef(cfg, make_weights(cfg, seed=list(CONFIGS).index(name)))
    ref.forward(IDS)
    print(f"{name}: routing margin {ref.min_margin:.2e}, bias changed {ref.n_bias_changed} of {ref.n_routed}")
    if variant(cfg) == "v3":
        assert ref.n_bias_changed > 0.2 * ref.n_routed


def test_latent_norm_eps_is_not_rms_norm_eps():
    """Kimi-K2.5 (rms_norm_eps 1e-5): transformers' q_a_layernorm / kv_a_layernorm keep eps
    1e-6; the tiny checkpoint's small latents make the difference far larger than the bound."""
    cfg = make_config("kimi-k25")
    w = make_weights(cfg, seed=list(CONFIGS).index("kimi-k25"))
    a = DeepseekRef(cfg, w).forward(IDS)
    b = DeepseekRef(cfg, w, latent_eps=None).forward(IDS)
    assert rel_err(b, a) > 100 * TOL["F32"]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_config_forms_parse_alike(name):
    """The hub form (rope_scaling, rope_theta) and the transformers 5 form (rope_parameters,
    head_dim = qk_rope_head_dim) mean the same model; fused experts are the same weights."""
    cfg = make_config(name)
    hub, v5 = config_json(cfg, "hub"), config_json(cfg, "5")
    assert rope_params(hub) == rope_params(v5) == rope_params(cfg)
    t5 = text_config(v5)
    assert not {"rope_scaling", "rope_theta", "torch_dtype"} & set(t5)
    assert t5["head_dim"] == t5["qk_rope_head_dim"] != t5["qk_nope_head_dim"] + t5["qk_rope_head_dim"]
    w = make_weights(cfg, seed=1)
    a = DeepseekRef(hub, w).forward(IDS[:20])
    b = DeepseekRef(v5, fuse_experts(w)).forward(IDS[:20])
    assert np.abs(a - b).max() < 1e-12


@pytest.mark.parametrize("name,fmt", [(n, "GGUF") for n in GGUF_CONFIGS] + [(n, "GGUF-kv_b") for n in GGUF_OLD_CONFIGS])
def test_gguf_read_back_as_llama_cpp_does(tmp_path, name, fmt):
    """The GGUF file, read with llama.cpp's rules (load_gguf), is the same model as the HF
    weights it was written from; its tensors have llama.cpp's shapes and names."""
    import gguf
    path, w, cfg = model_of(name, fmt, tmp_path)
    cfg2, w2 = load_gguf(path)
    c = text_config(cfg)
    L = c["num_hidden_layers"]
    main = {k: v for k, v in canonical_weights(w).items() if not k.startswith(f"model.layers.{L}.")}  # no MTP
    assert sorted(w2) == sorted(main)
    assert variant(cfg2) == variant(cfg) and rope_params(cfg2)["rope_type"] == rope_params(cfg)["rope_type"]
    err = rel_err(DeepseekRef(cfg2, w2).forward(IDS), reference_logits(name, False)[0])
    assert err < 1e-6, err
    r = gguf.GGUFReader(str(path))
    shapes = {t.name: [int(x) for x in t.shape] for t in r.tensors}  # ggml ne order
    H, nope, vd, kvr, rd = (c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"], c["kv_lora_rank"],
                            c["qk_rope_head_dim"])
    last = L - 1
    if fmt == "GGUF":
        assert shapes[f"blk.{last}.attn_k_b.weight"] == [nope, kvr, H]
        assert shapes[f"blk.{last}.attn_v_b.weight"] == [kvr, vd, H]
        assert not any(n.endswith("attn_kv_b.weight") for n in shapes)
        assert r.fields["deepseek2.attention.head_count_kv"].contents() == 1
        assert r.fields["deepseek2.attention.key_length"].contents() == kvr + rd
    else:
        assert shapes[f"blk.{last}.attn_kv_b.weight"] == [kvr, H * (nope + vd)]
        assert "deepseek2.attention.key_length_mla" not in r.fields
        assert r.fields["deepseek2.attention.head_count_kv"].contents() == H
    assert shapes[f"blk.{last}.attn_kv_a_mqa.weight"] == [c["hidden_size"], kvr + rd]
    assert shapes[f"blk.{last}.ffn_gate_exps.weight"] == [c["hidden_size"], c["moe_intermediate_size"], c["n_routed_experts"]]
    assert (f"blk.{last}.exp_probs_b.bias" in shapes) == (variant(cfg) == "v3")
    assert ("blk.0.attn_q.weight" in shapes) == (c.get("q_lora_rank") is None)
    assert ("deepseek2.attention.q_lora_rank" in r.fields) == (c.get("q_lora_rank") is not None)


# ---- kaon against the reference ---------------------------------------------------------------

@pytest.mark.parametrize("name,fmt", CASES)
def test_logits(kaon_bin, tmp_path, name, fmt):
    model, w, cfg = model_of(name, fmt, tmp_path)
    ref, _ = reference_logits(name, fmt == "BF16")
    for mode in ("prefill", "decode", "chunk5"):
        assert_logits_match(kaon_logits(kaon_bin, model, IDS, tmp_path, mode), ref, TOL[fmt], f"{name} {fmt} {mode}")


@pytest.mark.parametrize("name,fmt", [("v2", "F32"), ("v2-lite", "GGUF-kv_b"), ("v3", "GGUF"), ("kimi-k2", "BF16"),
                                      ("kimi-k25", "F32"), ("v2-group", "BF16")])
def test_expanded_prefill_agrees_with_absorbed(kaon_bin, tmp_path, monkeypatch, name, fmt):
    """Prefill chunks run expanded (each head's keys and values from the cached latents,
    KAON_MLA_EXPAND_MIN=2 forces it for any chunk of 2 tokens or more): the same logits as the
    absorbed form (one prefill, and 5-token chunks whose keys include the earlier chunks'
    cached latents) to f32 rounding, and as the reference; decode steps stay absorbed."""
    model, w, cfg = model_of(name, fmt, tmp_path)
    ref, _ = reference_logits(name, fmt == "BF16")
    out = {}
    for expand in ("2", "1000000"):
        monkeypatch.setenv("KAON_MLA_EXPAND_MIN", expand)
        for mode in ("prefill", "chunk5"):
            out[expand, mode] = kaon_logits(kaon_bin, model, IDS, tmp_path, mode)
            assert_logits_match(out[expand, mode], ref, TOL[fmt], f"{name} {fmt} {mode} expand-min {expand}")
    for mode in ("prefill", "chunk5"):
        err = rel_err(out["2", mode], out["1000000", mode])
        print(f"{name} {fmt} {mode}: expanded vs absorbed {err:.2e}")
        assert 0 < err < 1e-5, (mode, err)  # > 0: the two forms did run (f32 sums in another order)


@pytest.mark.parametrize("name,fmt", [("v2", "F32"), ("v2-lite", "GGUF-kv_b"), ("v3", "GGUF"), ("kimi-k2", "BF16"),
                                      ("kimi-k25", "F32")])
def test_greedy_run(kaon_bin, tmp_path, name, fmt):
    """`kaon run --temp 0` continues a prompt longer than YaRN's original context as the
    reference does; a divergence may only start where the reference's top two are within 1e-3."""
    model, w, cfg = model_of(name, fmt, tmp_path)
    prompt, n = IDS[:40], 24
    want, margins = greedy(DeepseekRef(cfg, w, mla="absorbed"), prompt, n)
    assert_greedy_matches(kaon_greedy(kaon_bin, model, prompt, n), want, margins, f"{name} {fmt}")


def _info_kv(exe, args, cfg):
    """`kaon info` must report the MLA cache: (kv_lora_rank + qk_rope_head_dim) per layer
    (576 for DeepSeek-V3 / Kimi: V3 in bf16 70272 B/token, 140544 in f32), either as its f32
    KiB/token figure or as an exact byte count."""
    r = subprocess.run([str(exe), "info"] + [str(a) for a in args], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        why = r.stderr.strip()
        pytest.fail(f"kaon info does not describe DeepSeek yet (src/model/deepseek2.c): {why}")
    w32, w16 = kv_bytes_per_token(cfg, 4), kv_bytes_per_token(cfg, 2)
    m = re.search(r"KV cache ([\d.]+) KiB/token \(f32\)", r.stdout)
    exact = re.search(rf"\b({w32}|{w16})\b", r.stdout)
    print(r.stdout)
    assert exact or (m and abs(float(m.group(1)) - w32 / 1024) <= 0.051), (w32, w16, m and m.group(0))


@pytest.mark.parametrize("name", ["DeepSeek-V3", "Kimi-K2-Instruct", "Kimi-K2.5", "DeepSeek-V2-Lite"])
def test_info_kv_bytes_real_config(kaon_bin, tmp_path, name):
    """The real configurations without weights (--load-format dummy): DeepSeek-V3 576 x 61
    elements per token (70272 B in bf16), Kimi-K2 / K2.5 the same (K2.5 through text_config),
    DeepSeek-V2-Lite 576 x 27 (31104 B in bf16)."""
    cfg = real_config(name)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    assert kv_bytes_per_token(cfg, 2) == {"DeepSeek-V3": 70272, "Kimi-K2-Instruct": 70272, "Kimi-K2.5": 70272,
                                          "DeepSeek-V2-Lite": 31104}[name]
    _info_kv(kaon_bin, ["--load-format", "dummy", "-m", folder], cfg)


@pytest.mark.parametrize("name,fmt", [("v3", "GGUF"), ("v2-lite", "GGUF-kv_b"), ("kimi-k25", "BF16")])
def test_info_kv_bytes_tiny(kaon_bin, tmp_path, name, fmt):
    """The tiny checkpoints: 72 elements per token and layer, whatever the GGUF layout says
    about heads (head_count_kv 1 and key_length 72 in the current layout, H and 56 in the old)."""
    model, w, cfg = model_of(name, fmt, tmp_path)
    _info_kv(kaon_bin, [model], cfg)
