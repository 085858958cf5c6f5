"""A numpy float64 reference forward pass of DeepSeek V2 / V3 text models (MLA attention +
DeepSeekMoE), as HF transformers 5.17 computes them: `DeepseekV2ForCausalLM` (model_type
deepseek_v2), `DeepseekV3ForCausalLM` (deepseek_v3, and Kimi-K2's kimi_k2), and the text part
of `KimiK25ForConditionalGeneration` (text_config, weights under `language_model.`); GGUF arch
`deepseek2`. Written from the equations of transformers' modeling code, independent of kaon.
Weights use HF names and layouts ([out, in]).

Facts, and where each was read (transformers = the transformers 5.17.0 wheel from PyPI,
transformers/models/deepseek_v2/, deepseek_v3/, kimi_k25/, modeling_rope_utils.py,
conversion_mapping.py, configuration_utils.py; llama.cpp = ggml-org/llama.cpp, see
deepseek_models.py for the GGUF side):

 1. Which semantics: model_type deepseek_v2 -> DeepseekV2 classes; deepseek_v3 -> DeepseekV3.
    transformers has no "kimi_k2" model type: Kimi-K2 ships model_type kimi_k2 with
    architectures DeepseekV3ForCausalLM and remote code; Kimi_K25Config maps a text_config of
    model_type kimi_k2 to deepseek_v3 (configuration_kimi_k25.py). So kimi_k2 = V3 here.
 2. RMSNorm (DeepseekV2RMSNorm / DeepseekV3RMSNorm): y = w * (x * rsqrt(mean(x^2) + eps)),
    computed in f32; weights initialised to ones (no 1 + w). The decoder norms
    (input_layernorm, post_attention_layernorm, model.norm) use config.rms_norm_eps, but
    q_a_layernorm and kv_a_layernorm are built as RMSNorm(rank) with the DEFAULT eps 1e-6 --
    whatever rms_norm_eps says (Kimi-K2.5: 1e-5). llama.cpp uses rms_norm_eps for every norm.
 3. MLA (DeepseekV2Attention / DeepseekV3Attention, identical but for RoPE):
        q = q_proj(h)                                   if q_lora_rank is None (V2-Lite)
          = q_b_proj(q_a_layernorm(q_a_proj(h)))        otherwise
        q -> [T, H, qk_nope + qk_rope], q_nope | q_pe
        ckv = kv_a_proj_with_mqa(h) [T, kv_lora + qk_rope] -> c = kv_a_layernorm(ckv[:kv_lora]),
              k_pe = ckv[kv_lora:] (ONE rope key shared by all heads, not normed)
        q_pe, k_pe = rope(q_pe), rope(k_pe)            (the cache holds c and roped k_pe)
        kv_b_proj(c) -> [T, H, qk_nope + v_head]: per head k_nope rows first, then v rows
        score = (q_nope . k_nope + q_pe . k_pe) * scaling, causal softmax, o = p @ v,
        o_proj over [T, H * v_head].
    Absorbed form (what the latent cache needs): W = kv_b_proj.weight viewed [H, nope + v,
    kv_lora], W_UK = W[:, :nope], W_UV = W[:, nope:]; q_abs = q_nope @ W_UK ([T, H, kv_lora]),
    score = q_abs . c + q_pe . k_pe, o_lat = p @ c, o = o_lat @ W_UV^T. Both are here
    (DeepseekRef(mla="naive" | "absorbed")) and must agree.
    num_key_value_heads is not used by the math (k and v are expanded to all H heads;
    repeat_kv with groups H / num_key_value_heads = 1 in every real config).
 4. scaling = qk_head_dim^-0.5, times mscale^2 with mscale = 0.1 * mscale_all_dim * ln(factor)
    + 1 when rope_type != "default" and mscale_all_dim is truthy (yarn_apply_mscale).
 5. RoPE covers the qk_rope_head_dim dims only; config.head_dim is overwritten with
    qk_rope_head_dim (both configs' __post_init__), and that is the dim of inv_freq.
    V2: apply_rotary_emb views (2i, 2i+1) as complex numbers and multiplies by
        freqs_cis = polar(1, pos * inv_freq_i) * attention_scaling: INTERLEAVED pairs, always
        (DeepseekV2 has no rope_interleave flag).
    V3: rope_interleave (default True) -> apply_rotary_pos_emb_interleave: x1 = x[0::2],
        x2 = x[1::2], out = cat(x1 cos - x2 sin, x2 cos + x1 sin): the same interleaved
        rotation, emitted de-interleaved (q and k alike, so scores are unchanged);
        rope_interleave False -> rotate_half (NeoX halves). cos/sin carry attention_scaling.
    llama.cpp: LLM_ARCH_DEEPSEEK2 -> LLAMA_ROPE_TYPE_NORM (adjacent pairs), no q/k permutation
    in the converter.
 6. YaRN (_compute_yarn_parameters, rope_type "yarn"; hub configs say "type": "yarn"):
        dim = qk_rope_head_dim, base = rope_theta (default 10000)
        factor = rope_parameters["factor"] (if None: max_position_embeddings / original)
        attention_factor = rope_parameters["attention_factor"] if given, else
            get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) if mscale AND
            mscale_all_dim are truthy, else get_mscale(factor) = 0.1 ln(factor) + 1;
            get_mscale(s, m) = 1 if s <= 1 else 0.1 m ln(s) + 1. It multiplies cos AND sin.
        beta_fast = rope_parameters.get("beta_fast") or 32, beta_slow = ... or 1
        corr_dim(r) = dim * ln(original_max_position_embeddings / (r 2 pi)) / (2 ln base)
        low = floor(corr_dim(beta_fast)), high = ceil(corr_dim(beta_slow)) (truncate, default
            True; else unrounded), clamped to [0, dim - 1]; high += 0.001 if low == high
        ramp_i = clamp((i - low) / (high - low), 0, 1), i < dim / 2
        inv_freq_i = (base^(-2i/dim) / factor) * ramp_i + base^(-2i/dim) * (1 - ramp_i)
    All in f32 in transformers (here f64). original_max_position_embeddings defaults to
    max_position_embeddings (standardize_rope_params).
 7. MoE layers: layer_idx >= first_k_dense_replace (moe_layer_freq is ignored); the others
    are a dense SwiGLU MLP of intermediate_size. Router logits in f32:
    F.linear(h.float(), gate.weight.float()).
    V2 (DeepseekV2TopkRouter): scores = softmax(logits); topk_method "greedy": top-k of the
        scores; "group_limited_greedy": group score = MAX of the group's scores, keep the
        topk_group best groups, masked_fill(others, 0.0), top-k. weights = scores[idx] *
        routed_scaling_factor. norm_topk_prob is NOT applied by transformers 5.17's V2 router
        (DeepSeek's remote code and llama.cpp apply it); every real V2 config has it false,
        so the reference refuses a V2 config with norm_topk_prob true.
    V3 (DeepseekV3TopkRouter): scores = sigmoid(logits); choice = scores +
        e_score_correction_bias (a buffer, kept in f32: _keep_in_fp32_modules_strict);
        group score = SUM OF THE TOP 2 choice values of each of n_group groups; keep
        topk_group groups; masked_fill(others, -inf) (4.x releases used 0.0, the same when
        every choice value is positive); idx = top-k of choice; weights = scores[idx]
        (UNBIASED); if norm_topk_prob: weights /= sum + 1e-20; weights *= routed_scaling_factor.
        scoring_func and topk_method are not read by the V3 classes (always sigmoid/noaux_tc).
    Output = sum_k weights_k * expert_k(h) + shared_experts(h); shared_experts is one SwiGLU
    of moe_intermediate_size * n_shared_experts. Experts in memory are fused
    (experts.gate_up_proj [E, 2F, d] gate rows first, experts.down_proj [E, d, F]);
    save_pretrained writes per-expert mlp.experts.{e}.{gate,up,down}_proj.weight
    (conversion_mapping "qwen2_moe" pattern, reverted on save: save_original_format=True).
 8. Decoder layer: h = x + attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h));
    final model.norm, lm_head (tie_word_embeddings False in every DeepSeek/Kimi config).
 9. MTP (num_nextn_predict_layers): checkpoint tensors model.layers.{num_hidden_layers}.* are
    not part of the main model; transformers ignores them (V3: _keys_to_ignore_on_load_
    unexpected = model.layers.61.*), llama.cpp's converter skips them (skip_mtp).
10. Kimi-K2.5 (Kimi_K25ForConditionalGeneration): checkpoint names language_model.model.* and
    language_model.lm_head.weight (conversion_mapping "kimi_k25" renames them), plus
    vision_tower.* / mm_projector.* that a text-only engine ignores; the text config is
    config["text_config"].

Checked against transformers 5.17.0 itself (torch 2.11 on a CPU, tests/gpu/test_deepseek_hf.py's
model building run without kaon): for each tiny variant of deepseek_models.py the reference's
logits (naive and absorbed) are within 1.3e-6 to 2.7e-6 (relative) of transformers' f32 ones,
on f32 and bf16-rounded weights, and its greedy ids equal transformers' with its cache.
"""
import math

import numpy as np

from np_ops import rmsnorm, rope, softmax

F32_KEEP = ("e_score_correction_bias",)  # stays f32 in bf16 checkpoints (HF keep-in-fp32)


def text_config(cfg):
    """The language-model part of a config.json (KimiK25ForConditionalGeneration nests it)."""
    return cfg.get("text_config") or cfg


def variant(cfg):
    """"v2" or "v3": which transformers classes define the math."""
    c = text_config(cfg)
    mt = c.get("model_type")
    if mt == "deepseek_v2":
        return "v2"
    if mt in ("deepseek_v3", "kimi_k2"):
        return "v3"
    arch = (c.get("architectures") or [""])[0]
    if arch == "DeepseekV2ForCausalLM":
        return "v2"
    if arch == "DeepseekV3ForCausalLM":
        return "v3"
    raise ValueError(f"not a DeepSeek V2/V3 config: model_type {mt!r}, architectures {arch!r}")


def rope_params(cfg):
    """One dict {rope_type, rope_theta, factor, original_max_position_embeddings, beta_fast,
    beta_slow, mscale, mscale_all_dim, attention_factor, truncate} from either config form:
    hub ("rope_scaling" with "type", "rope_theta") or transformers 5 ("rope_parameters")."""
    c = text_config(cfg)
    p = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
    p["rope_type"] = p.get("rope_type", p.get("type", "default"))
    p.pop("type", None)
    p.setdefault("rope_theta", float(c.get("rope_theta", 10000.0)))
    if p["rope_type"] == "yarn":
        p.setdefault("original_max_position_embeddings", c["max_position_embeddings"])
        if p.get("factor") is None:
            p["factor"] = c["max_position_embeddings"] / p["original_max_position_embeddings"]
    for k in ("factor", "beta_fast", "beta_slow", "rope_theta"):
        if p.get(k) is not None:
            p[k] = float(p[k])
    return p


def get_mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def rope_inv_freq(p, dim):
    """(inv_freq [dim/2] float64, attention_factor) for rope_type default or yarn."""
    base = float(p["rope_theta"])
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if p["rope_type"] == "default":
        return 1.0 / pos_freqs, 1.0
    if p["rope_type"] != "yarn":
        raise NotImplementedError(f"rope_type {p['rope_type']!r} in the DeepSeek reference")
    factor = float(p["factor"])
    att = p.get("attention_factor")
    if att is None:
        ms, msa = p.get("mscale"), p.get("mscale_all_dim")
        att = get_mscale(factor, ms) / get_mscale(factor, msa) if ms and msa else get_mscale(factor)
    beta_fast = p.get("beta_fast") or 32.0
    beta_slow = p.get("beta_slow") or 1.0
    L0 = float(p["original_max_position_embeddings"])

    def corr_dim(rot):
        return dim * math.log(L0 / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    return inter * ramp + extra * (1 - ramp), float(att)


def softmax_scale(cfg):
    c = text_config(cfg)
    scale = (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]) ** -0.5
    p = rope_params(cfg)
    if p["rope_type"] != "default" and p.get("mscale_all_dim"):
        m = get_mscale(float(p["factor"]), p["mscale_all_dim"])
        scale *= m * m
    return scale


def rope_interleaved(cfg):
    c = text_config(cfg)
    return True if variant(cfg) == "v2" else bool(c.get("rope_interleave", True))


def silu(x):
    return x / (1.0 + np.exp(-x))


def canonical_weights(w):
    """HF names as DeepseekV2/V3ForCausalLM has them, per-expert: strips Kimi-K2.5's
    `language_model.` prefix (drops vision_tower.* / mm_projector.*), splits transformers 5's
    fused experts (experts.gate_up_proj [E, 2F, d], experts.down_proj [E, d, F])."""
    out = {}
    for k, v in w.items():
        if k.startswith(("vision_tower.", "mm_projector.", "model.vision_tower.", "model.mm_projector.")):
            continue
        if k.startswith("language_model."):
            k = k[len("language_model."):]
        if k.endswith("mlp.experts.gate_up_proj"):
            p = k[: -len("gate_up_proj")]
            F = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{p}{e}.gate_proj.weight"] = v[e, :F]
                out[f"{p}{e}.up_proj.weight"] = v[e, F:]
            continue
        if k.endswith("mlp.experts.down_proj"):
            p = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{p}{e}.down_proj.weight"] = v[e]
            continue
        out[k] = v
    return out


def topk_desc(a, k):
    """Indices of the k largest entries per row (ties: lower index first)."""
    return np.argsort(-a, axis=-1, kind="stable")[..., :k]


class DeepseekRef:
    """DeepSeek V2/V3 forward in float64 with the MLA latent cache (c after kv_a_layernorm,
    k_pe after RoPE): forward(ids) feeds ids after what is cached, returns [len(ids), vocab].

    mla: "naive" (k/v expanded per head, as transformers) or "absorbed" (W_UK into q, W_UV
    after the softmax, attention over the latent cache). latent_eps: eps of q_a_layernorm /
    kv_a_layernorm (transformers: 1e-6 always; None: rms_norm_eps, as llama.cpp).

    Routing statistics: min_margin (smallest gap at a decision boundary: k-th vs (k+1)-th
    candidate, and the topk_group-th vs next group score; in logits for V2's softmax, in
    biased sigmoid scores for V3), n_routed (token-layer decisions)
    and n_bias_changed (decisions whose expert set differs without e_score_correction_bias)."""

    def __init__(self, cfg, weights, mla="naive", latent_eps=1e-6):
        c = self.c = text_config(cfg)
        self.kind = variant(cfg)
        self.w = {k: np.asarray(v, np.float64) for k, v in canonical_weights(weights).items()}
        self.mla = mla
        self.d, self.L, self.H = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
        self.nope, self.rd, self.vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.kvr, self.qr = c["kv_lora_rank"], c.get("q_lora_rank")
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.latent_eps = self.eps if latent_eps is None else latent_eps
        self.dense = c.get("first_k_dense_replace", 0 if self.kind == "v2" else 3)
        self.E, self.k = c["n_routed_experts"], c["num_experts_per_tok"]
        self.rsf = float(c.get("routed_scaling_factor", 1.0 if self.kind == "v2" else 2.5))
        self.n_group = c.get("n_group") or 1
        self.topk_group = c.get("topk_group") or 1
        if self.kind == "v2":
            self.topk_method = c.get("topk_method", "greedy")
            if self.topk_method not in ("greedy", "group_limited_greedy"):
                raise NotImplementedError(f"V2 topk_method {self.topk_method!r}")
            if c.get("norm_topk_prob"):
                raise NotImplementedError("V2 with norm_topk_prob true: transformers 5.17 ignores it, "
                                          "DeepSeek's code and llama.cpp apply it")
            self.norm_topk = False
        else:
            assert c.get("scoring_func", "sigmoid") == "sigmoid", c.get("scoring_func")
            assert c.get("topk_method", "noaux_tc") == "noaux_tc", c.get("topk_method")
            self.norm_topk = bool(c.get("norm_topk_prob", True))
        act = c.get("hidden_act", "silu")
        if act != "silu":
            raise NotImplementedError(f"hidden_act {act!r}")
        self.inv, self.att = rope_inv_freq(rope_params(cfg), self.rd)
        self.interleaved = rope_interleaved(cfg)
        self.scale = softmax_scale(cfg)
        self.min_margin = np.inf
        self.n_routed = self.n_bias_changed = 0
        self.reset()

    kv_quant = None  # f(x) -> x as the cache stores it, or None

    def reset(self):
        self.C = [np.zeros((0, self.kvr)) for _ in range(self.L)]     # latent, after kv_a_layernorm
        self.KPE = [np.zeros((0, self.rd)) for _ in range(self.L)]    # shared rope key, after RoPE

    # ---- attention ------------------------------------------------------------------------

    def attention(self, l, h, pos):
        w, p, T, H = self.w, f"model.layers.{l}.self_attn.", h.shape[0], self.H
        if self.qr is None:
            q = h @ w[p + "q_proj.weight"].T
        else:
            qa = rmsnorm(h @ w[p + "q_a_proj.weight"].T, w[p + "q_a_layernorm.weight"], self.latent_eps)
            q = qa @ w[p + "q_b_proj.weight"].T
        q = q.reshape(T, H, self.nope + self.rd)
        q_nope, q_pe = q[..., : self.nope], q[..., self.nope:]
        ckv = h @ w[p + "kv_a_proj_with_mqa.weight"].T                 # [T, kv_lora + rope]
        c = rmsnorm(ckv[:, : self.kvr], w[p + "kv_a_layernorm.weight"], self.latent_eps)
        k_pe = ckv[:, self.kvr:]
        q_pe = rope(q_pe, pos, self.inv, self.att, self.interleaved)
        k_pe = rope(k_pe, pos, self.inv, self.att, self.interleaved)
        if self.kv_quant:  # what a quantized cache gives back (e.g. e4m3 round trips)
            c, k_pe = self.kv_quant(c), self.kv_quant(k_pe)
        C = self.C[l] = np.concatenate([self.C[l], c])                # [S, kv_lora]
        KPE = self.KPE[l] = np.concatenate([self.KPE[l], k_pe])       # [S, rope]
        Wkv = w[p + "kv_b_proj.weight"].reshape(H, self.nope + self.vd, self.kvr)
        W_UK, W_UV = Wkv[:, : self.nope], Wkv[:, self.nope:]          # [H, nope, r], [H, v, r]
        rope_s = np.einsum("thd,sd->hts", q_pe, KPE)
        if self.mla == "naive":
            k_nope = np.einsum("sr,hnr->shn", C, W_UK)
            v = np.einsum("sr,hvr->shv", C, W_UV)
            att = (np.einsum("thn,shn->hts", q_nope, k_nope) + rope_s) * self.scale
        else:
            q_abs = np.einsum("thn,hnr->thr", q_nope, W_UK)              # [T, H, kv_lora]
            att = (np.einsum("thr,sr->hts", q_abs, C) + rope_s) * self.scale
        S = C.shape[0]
        att = softmax(att, (np.arange(S)[None, :] > pos[:, None])[None])
        if self.mla == "naive":
            o = np.einsum("hts,shv->thv", att, v)
        else:
            o_lat = np.einsum("hts,sr->thr", att, C)                     # [T, H, kv_lora]
            o = np.einsum("thr,hvr->thv", o_lat, W_UV)
        return o.reshape(T, H * self.vd) @ w[p + "o_proj.weight"].T

    # ---- feed-forward ---------------------------------------------------------------------

    def swiglu(self, p, h):
        w = self.w
        return (silu(h @ w[p + "gate_proj.weight"].T) * (h @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T

    def route(self, l, h):
        """(expert ids [T, k], weights [T, k]) as the transformers router of this variant."""
        p = f"model.layers.{l}.mlp.gate."
        logits = h @ self.w[p + "weight"].T                            # [T, E]
        T, E, G = h.shape[0], self.E, self.n_group
        if self.kind == "v2":
            scores = softmax(logits)
            # Softmax is monotonic: choose (and measure margins) on the logits, where a gap
            # means the same to every precision; masked groups (0.0 in transformers) -> -inf.
            choice = logits.copy()
            if self.topk_method == "group_limited_greedy":
                keep = self._groups(logits.reshape(T, G, E // G).max(-1))
                choice = np.where(np.repeat(keep, E // G, axis=1), choice, -np.inf)
            unbiased = None
        else:
            scores = 1.0 / (1.0 + np.exp(-logits))
            bias = self.w[p + "e_score_correction_bias"]

            def select(ch, record):
                gs = np.sort(ch.reshape(T, G, E // G), -1)[..., -2:].sum(-1)
                keep = self._groups(gs, record)
                return np.where(np.repeat(keep, E // G, axis=1), ch, -np.inf)
            choice = select(scores + bias[None], True)
            unbiased = topk_desc(select(scores, False), self.k)
        idx = topk_desc(choice, self.k)
        srt = -np.sort(-choice, -1)
        self.min_margin = min(self.min_margin, float((srt[:, self.k - 1] - srt[:, self.k]).min()))
        self.n_routed += T
        if unbiased is not None:
            self.n_bias_changed += int(sum(set(a) != set(b) for a, b in zip(idx, unbiased)))
        wts = np.take_along_axis(scores, idx, -1)
        if self.norm_topk:
            wts = wts / (wts.sum(-1, keepdims=True) + 1e-20)
        return idx, wts * self.rsf

    def _groups(self, gs, record=True):
        """[T, G] group scores -> [T, G] mask of the topk_group best groups."""
        T, G = gs.shape
        keep = np.zeros((T, G), bool)
        np.put_along_axis(keep, topk_desc(gs, self.topk_group), True, -1)
        if record and self.topk_group < G:
            srt = -np.sort(-gs, -1)
            self.min_margin = min(self.min_margin, float((srt[:, self.topk_group - 1] - srt[:, self.topk_group]).min()))
        return keep

    def mlp(self, l, h):
        p = f"model.layers.{l}.mlp."
        if l < self.dense:
            return self.swiglu(p, h)
        idx, wts = self.route(l, h)
        out = self.swiglu(p + "shared_experts.", h)
        for t in range(h.shape[0]):
            for j in range(self.k):
                out[t] += wts[t, j] * self.swiglu(f"{p}experts.{idx[t, j]}.", h[t:t + 1])[0]
        return out

    # ---- model ----------------------------------------------------------------------------

    def forward(self, ids):
        w, T = self.w, len(ids)
        start = self.C[0].shape[0]
        pos = np.arange(start, start + T)
        x = w["model.embed_tokens.weight"][np.asarray(ids)]
        for l in range(self.L):
            p = f"model.layers.{l}."
            x = x + self.attention(l, rmsnorm(x, w[p + "input_layernorm.weight"], self.eps), pos)
            x = x + self.mlp(l, rmsnorm(x, w[p + "post_attention_layernorm.weight"], self.eps))
        x = rmsnorm(x, w["model.norm.weight"], self.eps)
        return x @ w["lm_head.weight"].T


def kv_elements_per_token(cfg):
    """MLA cache elements per token and layer: kv_lora_rank + qk_rope_head_dim (576 for V3)."""
    c = text_config(cfg)
    return c["kv_lora_rank"] + c["qk_rope_head_dim"]

