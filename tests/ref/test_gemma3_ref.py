"""Gemma 3 (src/model/gemma3.c) on the CPU against the numpy float64 reference (gemma3_ref.py):
tiny random checkpoints (gemma3_models.py) as HF folders in F32 and BF16, in the config.json
forms of transformers 4.50, 4.55 and 5, and as llama.cpp-style GGUF files; prefill, decode
(one token per step) and chunked prefill, prompts several times longer than the sliding window;
greedy ids through `kaon run`.

The reference itself is checked here against a second transcription of transformers'
modeling_gemma3.py (hf_literal_forward: the torch code's shapes and steps in float32 numpy) and
by properties of its sliding mask; tests/gpu/test_gemma3_hf.py checks it against transformers.

Until kaon supports Gemma 3, the kaon tests FAIL (not skip) with kaon's own error message.
"""
import math
from functools import partial

import numpy as np
import pytest

import kaon_cli
from gemma3_models import CONFIGS, GGUF_CONFIGS, config_json, load_gguf, make_config, make_weights, model_of, save_hf
from gemma3_ref import FULL, SLIDING, Gemma3Ref, layer_types, rope_params
from logit_checks import (assert_greedy_matches, assert_logits_match, assert_matches_transcription, greedy,
                          prefill_and_decode, rel_err)
from tiny_tokenizer import N_BYTES_FROM, tokenizer_vocab

# 37 ids: more than four sliding windows of 8; every region of the vocabulary (specials,
# byte tokens, pieces) appears.
IDS = [2, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13, 8, 150, 77, 31,
       270, 263, 1, 280, 101, 102, 33, 33, 33, 290, 6, 261, 262, 180, 44, 9, 298]
TOL = {"F32": 1e-4, "BF16": 1e-2, "GGUF": 1e-4}
CASES = [(n, f) for n in CONFIGS for f in ("F32", "BF16", "GGUF") if f != "GGUF" or n in GGUF_CONFIGS]


def reference(cfg, w, fmt):
    # HF multiplies the embeddings by sqrt(hidden) in the model's dtype (bf16-rounded for a
    # bf16 model); F32 and GGUF (llama.cpp: sqrtf) use the f32 value.
    return Gemma3Ref(cfg, w, embed_scale="bf16" if fmt == "BF16" else "f32")


NOT_YET = kaon_cli.NotYet("kaon does not run Gemma 3 yet (src/model/gemma3.c)")
kaon_logits = partial(kaon_cli.logits, not_yet=NOT_YET)
kaon_greedy = partial(kaon_cli.greedy, not_yet=NOT_YET)


# ---- the reference against a literal transcription of transformers' code -------------------

def hf_literal_forward(cfg, w, ids):
    """transformers' Gemma3ForCausalLM.forward (eager attention, no cache, batch 1) step by
    step in float32 numpy, following modeling_gemma3.py's classes: Gemma3TextScaledWordEmbedding,
    Gemma3RotaryEmbedding (one per layer type), Gemma3RMSNorm, Gemma3Attention with
    eager_attention_forward and masking_utils' causal / sliding_window_overlay masks,
    Gemma3MLP, Gemma3DecoderLayer, the final norm, lm_head and final_logit_softcapping."""
    f32 = np.float32
    c = cfg
    W = {k: np.asarray(v, f32) for k, v in w.items()}
    hidden, heads, kv_heads, head_dim = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]

    def rms_norm(x, weight):  # Gemma3RMSNorm.forward
        xf = x.astype(f32)
        out = xf * (1.0 / np.sqrt((xf ** 2).mean(-1, keepdims=True) + f32(eps))).astype(f32)
        out = out * (f32(1.0) + weight.astype(f32))
        return out.astype(x.dtype)

    def rotary(layer_type, position_ids):  # Gemma3RotaryEmbedding (compute_default / linear)
        p = rope_params(c)[layer_type]
        base = p["rope_theta"]
        inv_freq = (1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(f32) / head_dim))).astype(f32)
        if p["rope_type"] == "linear":
            inv_freq = (inv_freq / f32(p["factor"])).astype(f32)
        freqs = (inv_freq[:, None] @ position_ids[None, :].astype(f32)).T  # [T, hd/2]
        emb = np.concatenate([freqs, freqs], axis=-1)
        return np.cos(emb).astype(f32), np.sin(emb).astype(f32)

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return np.concatenate([-x2, x1], axis=-1)

    def mask(T, sliding_window=None):  # create_causal_mask / create_sliding_window_causal_mask
        q_idx, kv_idx = np.arange(T)[:, None], np.arange(T)[None, :]
        allowed = kv_idx <= q_idx  # causal_mask_function
        if sliding_window is not None:
            allowed &= kv_idx > q_idx - sliding_window  # sliding_window_overlay
        return np.where(allowed, f32(0), np.finfo(f32).min)[None]  # [1, T, T], additive

    ids = np.asarray(ids)
    T = len(ids)
    position_ids = np.arange(T)
    x = W["model.embed_tokens.weight"][ids] * f32(hidden ** 0.5)  # embed_scale.to(weight.dtype)
    lt = layer_types(c)
    pos_emb = {t: rotary(t, position_ids) for t in (SLIDING, FULL)}
    masks = {FULL: mask(T), SLIDING: mask(T, c["sliding_window"])}
    scaling = c["query_pre_attn_scalar"] ** -0.5
    groups = heads // kv_heads
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        residual = x
        h = rms_norm(x, W[p + "input_layernorm.weight"])
        q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, -1, head_dim).transpose(1, 0, 2)  # [H, T, D]
        k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, -1, head_dim).transpose(1, 0, 2)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, -1, head_dim).transpose(1, 0, 2)
        q = rms_norm(q, W[p + "self_attn.q_norm.weight"])
        k = rms_norm(k, W[p + "self_attn.k_norm.weight"])
        cos, sin = pos_emb[lt[l]]
        q = q * cos[None] + rotate_half(q) * sin[None]
        k = k * cos[None] + rotate_half(k) * sin[None]
        k = np.repeat(k, groups, axis=0)  # repeat_kv
        v = np.repeat(v, groups, axis=0)
        attn = (q @ k.transpose(0, 2, 1)) * f32(scaling) + masks[lt[l]]
        attn = np.exp(attn - attn.max(-1, keepdims=True))
        attn = (attn / attn.sum(-1, keepdims=True)).astype(f32)
        o = (attn @ v).transpose(1, 0, 2).reshape(T, -1)
        o = o @ W[p + "self_attn.o_proj.weight"].T
        x = residual + rms_norm(o, W[p + "post_attention_layernorm.weight"])
        residual = x
        h = rms_norm(x, W[p + "pre_feedforward_layernorm.weight"])
        g = h @ W[p + "mlp.gate_proj.weight"].T
        act = f32(0.5) * g * (f32(1) + np.tanh(f32(math.sqrt(2 / math.pi)) * (g + f32(0.044715) * g ** 3)))
        m = (act * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
        x = residual + rms_norm(m, W[p + "post_feedforward_layernorm.weight"])
    x = rms_norm(x, W["model.norm.weight"])
    lm_head = W["model.embed_tokens.weight"] if c.get("tie_word_embeddings", True) else W["lm_head.weight"]
    logits = x @ lm_head.T
    if c.get("final_logit_softcapping") is not None:
        cap = f32(c["final_logit_softcapping"])
        logits = np.tanh(logits / cap) * cap
    return logits


@pytest.mark.parametrize("name", list(CONFIGS))
def test_reference_equals_literal_transcription(name):
    cfg = make_config(name)
    w = make_weights(cfg, seed=11)
    assert_matches_transcription(hf_literal_forward(cfg, w, IDS), Gemma3Ref(cfg, w).forward(IDS), name)


def test_reference_prefill_equals_decode():
    cfg = make_config("hd256")
    a, b = prefill_and_decode(Gemma3Ref(cfg, make_weights(cfg, seed=3)), IDS)
    assert np.abs(a - b).max() < 1e-10


def test_reference_sliding_window_is_window_tokens_including_self():
    """One sliding layer, window W: the last position sees the W positions ending at itself
    (q - k < W), not W + 1; a full layer sees everything."""
    cfg = dict(make_config("tiny"), num_hidden_layers=1, layer_types=[SLIDING])
    w = make_weights(cfg, seed=5)
    W, ids = cfg["sliding_window"], list(IDS[:20])
    last = Gemma3Ref(cfg, w).forward(ids)[-1]

    def changed(pos):
        alt = list(ids)
        alt[pos] = (alt[pos] + 1) % cfg["vocab_size"]
        return np.abs(Gemma3Ref(cfg, w).forward(alt)[-1] - last).max() > 1e-9
    p = len(ids) - 1
    assert changed(p - (W - 1)) and not changed(p - W) and not changed(0)
    full = dict(cfg, layer_types=[FULL])
    last_full = Gemma3Ref(full, w).forward(ids)[-1]
    alt = list(ids)
    alt[0] += 1
    assert np.abs(Gemma3Ref(full, w).forward(alt)[-1] - last_full).max() > 1e-9


@pytest.mark.parametrize("name", list(CONFIGS))
def test_config_forms_parse_alike(name):
    cfg = make_config(name)
    forms = ["4.55", "5"] + ([] if "layer_types" in cfg else ["4.50"])
    parsed = [(layer_types(config_json(cfg, f)), rope_params(config_json(cfg, f))) for f in forms]
    assert all(p == parsed[0] for p in parsed), parsed
    assert parsed[0] == (layer_types(cfg), rope_params(cfg))
    v5 = config_json(cfg, "5")
    assert not {"rope_theta", "rope_local_base_freq", "rope_scaling", "torch_dtype"} & set(v5)


@pytest.mark.parametrize("name", GGUF_CONFIGS)
def test_gguf_read_back_as_llama_cpp_does(tmp_path, name):
    """The GGUF file, read with llama.cpp's rules (load_gguf: norms minus 1, local base and
    pattern hard-coded), is the same model as the HF weights it was written from."""
    path, w, cfg = model_of(name, "GGUF", tmp_path)
    cfg2, w2 = load_gguf(path)
    assert sorted(w2) == sorted(w)
    assert layer_types(cfg2) == layer_types(cfg) and rope_params(cfg2) == rope_params(cfg)
    err = rel_err(Gemma3Ref(cfg2, w2).forward(IDS), Gemma3Ref(cfg, w).forward(IDS))
    assert err < 1e-6, err


def test_tokenizer_files(tmp_path):
    from tokenizers import Tokenizer
    folder = save_hf(tmp_path / "tok", make_config("tiny"), make_weights(make_config("tiny")))
    tk = Tokenizer.from_file(str(folder / "tokenizer.json"))
    enc = tk.encode("the cat sat on the mat! é")
    assert enc.ids[0] == 2 and 3 not in enc.ids  # <bos> first; bytes fall back, never <unk>
    assert tk.decode(enc.ids, skip_special_tokens=True) == "the cat sat on the mat! é"
    assert tk.get_vocab_size() == 300 == len(tokenizer_vocab())
    assert tk.token_to_id("<0x41>") == N_BYTES_FROM + 0x41


# ---- kaon against the reference ---------------------------------------------------------------

@pytest.mark.parametrize("name,fmt", CASES)
def test_logits(kaon_bin, tmp_path, name, fmt):
    model, w, cfg = model_of(name, fmt, tmp_path)
    ref = reference(cfg, w, fmt).forward(IDS)
    for mode in ("prefill", "decode", "chunk5"):
        assert_logits_match(kaon_logits(kaon_bin, model, IDS, tmp_path, mode), ref, TOL[fmt], f"{name} {fmt} {mode}")


@pytest.mark.parametrize("name,form", [("tiny", "4.50"), ("tiny", "4.55"), ("hd256", "4.50"), ("hd256", "4.55"),
                                       ("hf-extras", "4.55")])
def test_older_config_forms(kaon_bin, tmp_path, name, form):
    """The same weights under the config.json of older transformers releases (rope_theta /
    rope_local_base_freq / rope_scaling instead of rope_parameters; sliding_window_pattern
    instead of layer_types in 4.50) give the same logits."""
    model, w, cfg = model_of(name, "F32", tmp_path, form=form)
    ref = reference(cfg, w, "F32").forward(IDS)
    err = rel_err(kaon_logits(kaon_bin, model, IDS, tmp_path), ref)
    print(f"{name} config form {form}: relative logit error {err:.2e}")
    assert err < TOL["F32"]


@pytest.mark.parametrize("name,fmt", [("tiny", "F32"), ("tiny", "GGUF"), ("hd256", "F32"), ("hd256", "GGUF"),
                                      ("hf-extras", "F32")])
def test_greedy_run(kaon_bin, tmp_path, name, fmt):
    """`kaon run --temp 0` continues a prompt longer than the window as the reference does; a
    divergence may only start where the reference's top two are within 1e-3."""
    model, w, cfg = model_of(name, fmt, tmp_path)
    prompt, n = IDS[:21], 24
    want, margins = greedy(reference(cfg, w, fmt), prompt, n)
    assert_greedy_matches(kaon_greedy(kaon_bin, model, prompt, n), want, margins, f"{name} {fmt}")
