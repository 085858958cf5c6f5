// Loading: map the file, describe the model, find every weight by name and check its shape.
#include "model/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json_util.h"
#include "model/moe.h"
#include "util/err.h"
#include "util/half.h"
#include "util/log.h"

// ---- config from GGUF metadata ---------------------------------------------------------

static int64_t arch_int(const kaon_gguf *g, const char *arch, const char *key, int64_t dflt) {
    char full[256];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    return kaon_gguf_get_int(g, full, dflt);
}

static double arch_float(const kaon_gguf *g, const char *arch, const char *key, double dflt) {
    char full[256];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    return kaon_gguf_get_float(g, full, dflt);
}

static int config_from_gguf(const kaon_gguf *g, kaon_model_config *c) {
    kaon_model_config_init(c);
    kaon_gguf_str s;
    if (!kaon_gguf_get_str(g, "general.architecture", &s))
        return kaon_set_error("GGUF file has no general.architecture");
    if (s.len >= sizeof c->arch_name) s.len = sizeof c->arch_name - 1;
    memcpy(c->arch_name, s.ptr, s.len);
    c->arch_name[s.len] = 0;
    c->arch = kaon_arch_from_name(c->arch_name);
    if (c->arch == KAON_ARCH_UNKNOWN) return kaon_model_config_validate(c);
    const char *a = c->arch_name;
    c->n_layers = (int)arch_int(g, a, "block_count", 0);
    c->hidden_size = (int)arch_int(g, a, "embedding_length", 0);
    c->intermediate_size = (int)arch_int(g, a, "feed_forward_length", 0);
    c->n_heads = (int)arch_int(g, a, "attention.head_count", 0);
    c->n_kv_heads = (int)arch_int(g, a, "attention.head_count_kv", c->n_heads);
    c->head_dim = (int)arch_int(g, a, "attention.key_length",
                                c->n_heads > 0 ? c->hidden_size / c->n_heads : 0);
    c->rope_dim = (int)arch_int(g, a, "rope.dimension_count", c->head_dim);
    c->max_position_embeddings = (int)arch_int(g, a, "context_length", 2048);
    c->rms_norm_eps = (float)arch_float(g, a, "attention.layer_norm_rms_epsilon", 1e-5);
    c->rope_theta = (float)arch_float(g, a, "rope.freq_base", 10000.0);
    enum kaon_gguf_type et;
    uint64_t n_tokens = 0;
    if (kaon_gguf_get_array(g, "tokenizer.ggml.tokens", &et, &n_tokens)) c->vocab_size = (int)n_tokens;
    c->vocab_size = (int)arch_int(g, a, "vocab_size", c->vocab_size);
    // llama.cpp's converter permutes Q/K rows of `llama` files so that RoPE rotates adjacent
    // pairs; qwen2/qwen3 files are not permuted and keep NeoX pairs.
    c->rope_interleaved = c->arch == KAON_ARCH_LLAMA;
    c->attention_bias = c->arch == KAON_ARCH_QWEN2;
    c->qk_norm = c->arch == KAON_ARCH_QWEN3;
    kaon_gguf_str st;
    char full[256];
    snprintf(full, sizeof full, "%s.rope.scaling.type", a);
    if (kaon_gguf_get_str(g, full, &st) && !kaon_gguf_str_eq(st, "none")) {
        if (kaon_gguf_str_eq(st, "linear")) {
            c->rope_scaling = KAON_ROPE_SCALING_LINEAR;
            c->rope_factor = (float)arch_float(g, a, "rope.scaling.factor", 1.0);
        } else {
            return kaon_set_error("unsupported GGUF rope scaling type '%.*s'", (int)st.len, st.ptr);
        }
    }
    c->tie_word_embeddings = kaon_gguf_find_tensor(g, "output.weight") == NULL;
    c->bos_token_id = (int)kaon_gguf_get_int(g, "tokenizer.ggml.bos_token_id", -1);
    int eos = (int)kaon_gguf_get_int(g, "tokenizer.ggml.eos_token_id", -1);
    if (eos >= 0) c->eos_token_ids[c->n_eos_token_ids++] = eos;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "gguf");
    kaon_moe_config_from_gguf(g, c);
    return kaon_model_config_validate(c);
}

// ---- weights -------------------------------------------------------------------------------

typedef struct lookup {
    kaon_model *m;
    const char *path;
} lookup;

int kaon_model_find_tensor(const kaon_model *m, const char *name, kaon_tensor *out) {
    memset(out, 0, sizeof *out);
    if (m->gguf) {
        const kaon_gguf_tensor *t = kaon_gguf_find_tensor(m->gguf, name);
        if (!t) return 0;
        kaon_dtype dt = kaon_dtype_from_ggml(t->ggml_type);
        if (dt == KAON_DTYPE_INVALID)
            return kaon_set_error("%s: tensor '%s' has unsupported type %u", m->path, name, t->ggml_type);
        out->dtype = dt;
        out->ndim = (int)t->n_dims;
        for (uint32_t i = 0; i < t->n_dims; i++) out->shape[i] = (int64_t)t->dims[t->n_dims - 1 - i];
        out->data = (void *)t->data;
        out->nbytes = t->nbytes;
        return 0;
    }
    if (!m->st) return 0;
    const kaon_st_tensor *t = kaon_safetensors_find(m->st, name);
    if (!t) return 0;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    out->data = (void *)t->data;
    out->nbytes = t->nbytes;
    return 0;
}

static int expect_shape(lookup *L, const char *name, const kaon_tensor *t, int ndim, int64_t d0,
                        int64_t d1) {
    bool ok = t->ndim == ndim && t->shape[0] == d0 && (ndim < 2 || t->shape[1] == d1);
    if (!ok) {
        if (ndim == 1)
            return kaon_set_error("%s: tensor '%s' has shape %s, expected [%lld]", L->path, name,
                                  t->ndim == 1 ? "[...]" : "of wrong rank", (long long)d0);
        return kaon_set_error("%s: tensor '%s' has shape [%lld, %lld] (rank %d), expected [%lld, %lld]",
                              L->path, name, (long long)t->shape[0],
                              (long long)(t->ndim > 1 ? t->shape[1] : 0), t->ndim, (long long)d0,
                              (long long)d1);
    }
    return 0;
}

static bool is_float_dtype(kaon_dtype d) { return d == KAON_F32 || d == KAON_F16 || d == KAON_BF16; }

// Loads one weight: required or optional, with the expected shape ([d0] or [d0, d1]).
static int load_weight(lookup *L, const char *name, bool required, int ndim, int64_t d0,
                       int64_t d1, kaon_tensor *out) {
    if (kaon_model_find_tensor(L->m, name, out)) return -1;
    if (!out->data) {
        if (required) return kaon_set_error("%s: missing tensor '%s'", L->path, name);
        return 0;
    }
    if (expect_shape(L, name, out, ndim, d0, d1)) return -1;
    if (ndim == 1 && !is_float_dtype(out->dtype))
        return kaon_set_error("%s: tensor '%s' is %s; norms and biases must be F32/F16/BF16",
                              L->path, name, kaon_dtype_name(out->dtype));
    if (ndim == 2 && kaon_dtype_row_bytes(out->dtype, d1) == 0)
        return kaon_set_error("%s: tensor '%s': row of %lld is not a whole number of %s blocks",
                              L->path, name, (long long)d1, kaon_dtype_name(out->dtype));
    L->m->n_params += (uint64_t)kaon_tensor_numel(out);
    L->m->weight_bytes += out->nbytes;
    return 0;
}

typedef struct name_set {
    const char *embd, *out_norm, *lm_head;
    const char *layer_fmt[14];  // printf formats with %d, in kaon_layer_weights order
} name_set;

enum { W_ATTN_NORM, W_Q, W_K, W_V, W_O, W_BQ, W_BK, W_BV, W_QN, W_KN, W_FFN_NORM, W_GATE, W_UP, W_DOWN };

static const name_set gguf_names = {
    "token_embd.weight", "output_norm.weight", "output.weight",
    {"blk.%d.attn_norm.weight", "blk.%d.attn_q.weight", "blk.%d.attn_k.weight",
     "blk.%d.attn_v.weight", "blk.%d.attn_output.weight", "blk.%d.attn_q.bias",
     "blk.%d.attn_k.bias", "blk.%d.attn_v.bias", "blk.%d.attn_q_norm.weight",
     "blk.%d.attn_k_norm.weight", "blk.%d.ffn_norm.weight", "blk.%d.ffn_gate.weight",
     "blk.%d.ffn_up.weight", "blk.%d.ffn_down.weight"}};

static const name_set hf_names = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
    {"model.layers.%d.input_layernorm.weight", "model.layers.%d.self_attn.q_proj.weight",
     "model.layers.%d.self_attn.k_proj.weight", "model.layers.%d.self_attn.v_proj.weight",
     "model.layers.%d.self_attn.o_proj.weight", "model.layers.%d.self_attn.q_proj.bias",
     "model.layers.%d.self_attn.k_proj.bias", "model.layers.%d.self_attn.v_proj.bias",
     "model.layers.%d.self_attn.q_norm.weight", "model.layers.%d.self_attn.k_norm.weight",
     "model.layers.%d.post_attention_layernorm.weight", "model.layers.%d.mlp.gate_proj.weight",
     "model.layers.%d.mlp.up_proj.weight", "model.layers.%d.mlp.down_proj.weight"}};

static int load_weights(kaon_model *m) {
    const kaon_model_config *c = &m->cfg;
    const name_set *N = m->gguf ? &gguf_names : &hf_names;
    lookup L = {m, m->path};
    const int64_t dim = c->hidden_size, ffn = c->intermediate_size, V = c->vocab_size;
    const int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    if (load_weight(&L, N->embd, true, 2, V, dim, &m->tok_embd)) return -1;
    if (load_weight(&L, N->out_norm, true, 1, dim, 0, &m->out_norm)) return -1;
    if (load_weight(&L, N->lm_head, !c->tie_word_embeddings, 2, V, dim, &m->lm_head)) return -1;
    if (!m->lm_head.data) m->lm_head = m->tok_embd;  // tied
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return kaon_set_error("out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        kaon_layer_weights *w = &m->layers[l];
        const bool moe = kaon_moe_layer_wanted(m, l);  // experts instead of the dense MLP
        struct { kaon_tensor *t; bool req; int nd; int64_t d0, d1; } spec[14] = {
            [W_ATTN_NORM] = {&w->attn_norm, true, 1, dim, 0},
            [W_Q] = {&w->wq, true, 2, qd, dim},
            [W_K] = {&w->wk, true, 2, kvd, dim},
            [W_V] = {&w->wv, true, 2, kvd, dim},
            [W_O] = {&w->wo, true, 2, dim, qd},
            [W_BQ] = {&w->bq, c->attention_bias, 1, qd, 0},
            [W_BK] = {&w->bk, c->attention_bias, 1, kvd, 0},
            [W_BV] = {&w->bv, c->attention_bias, 1, kvd, 0},
            [W_QN] = {&w->q_norm, c->qk_norm, 1, c->head_dim, 0},
            [W_KN] = {&w->k_norm, c->qk_norm, 1, c->head_dim, 0},
            [W_FFN_NORM] = {&w->ffn_norm, true, 1, dim, 0},
            [W_GATE] = {&w->w_gate, true, 2, ffn, dim},
            [W_UP] = {&w->w_up, true, 2, ffn, dim},
            [W_DOWN] = {&w->w_down, true, 2, dim, ffn},
        };
        for (int i = 0; i < 14; i++) {
            char name[256];
            if (moe && i >= W_GATE) break;
            snprintf(name, sizeof name, N->layer_fmt[i], l);
            if (load_weight(&L, name, spec[i].req, spec[i].nd, spec[i].d0, spec[i].d1, spec[i].t))
                return -1;
        }
        if (moe) {
            if (kaon_moe_load_layer(m, l)) return -1;
            w->moe = &m->moe[l];
        }
    }
    return 0;
}

// Biases are tiny; stored F16/BF16 ones get an F32 copy so every backend sees one format.
static int widen_biases(kaon_model *m) {
    size_t total = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        kaon_tensor *bs[3] = {&m->layers[l].bq, &m->layers[l].bk, &m->layers[l].bv};
        for (int i = 0; i < 3; i++)
            if (bs[i]->data && bs[i]->dtype != KAON_F32) total += (size_t)bs[i]->shape[0];
    }
    if (!total) return 0;
    m->bias_f32 = malloc(sizeof(float) * total);
    if (!m->bias_f32) return kaon_set_error("out of memory");
    float *dst = m->bias_f32;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        kaon_tensor *bs[3] = {&m->layers[l].bq, &m->layers[l].bk, &m->layers[l].bv};
        for (int i = 0; i < 3; i++) {
            kaon_tensor *t = bs[i];
            if (!t->data || t->dtype == KAON_F32) continue;
            const uint16_t *src = t->data;
            for (int64_t k = 0; k < t->shape[0]; k++)
                dst[k] = t->dtype == KAON_BF16 ? kaon_bf16_to_f32(src[k]) : kaon_f16_to_f32(src[k]);
            t->data = dst;
            t->dtype = KAON_F32;
            t->nbytes = sizeof(float) * (size_t)t->shape[0];
            dst += t->shape[0];
        }
    }
    return 0;
}

// ---- RoPE frequencies ----------------------------------------------------------------------

static int build_rope(kaon_model *m) {
    const kaon_model_config *c = &m->cfg;
    int half = c->rope_dim / 2;
    m->rope_inv_freq = malloc(sizeof(float) * (size_t)half);
    if (!m->rope_inv_freq) return kaon_set_error("out of memory");
    // GGUF llama3-style scaling ships as per-frequency divisors in rope_freqs.weight.
    kaon_tensor freqs = {0};
    if (m->gguf) {
        lookup L = {m, m->path};
        if (load_weight(&L, "rope_freqs.weight", false, 1, half, 0, &freqs)) return -1;
        if (freqs.data && freqs.dtype != KAON_F32)
            return kaon_set_error("%s: rope_freqs.weight must be F32", m->path);
    }
    for (int j = 0; j < half; j++) {
        double inv = pow((double)c->rope_theta, -2.0 * j / c->rope_dim);
        if (c->rope_scaling == KAON_ROPE_SCALING_LINEAR) {
            inv /= c->rope_factor;
        } else if (c->rope_scaling == KAON_ROPE_SCALING_LLAMA3) {
            double lo_wl = c->rope_original_max_pos / c->rope_low_freq_factor;
            double hi_wl = c->rope_original_max_pos / c->rope_high_freq_factor;
            double wl = 2 * M_PI / inv;
            if (wl > lo_wl) {
                inv /= c->rope_factor;
            } else if (wl >= hi_wl) {
                double smooth = (c->rope_original_max_pos / wl - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                inv = (1 - smooth) * inv / c->rope_factor + smooth * inv;
            }
        }
        if (freqs.data) inv /= ((const float *)freqs.data)[j];
        m->rope_inv_freq[j] = (float)inv;
    }
    m->rope.rot_dim = c->rope_dim;
    m->rope.interleaved = c->rope_interleaved;
    m->rope.inv_freq = m->rope_inv_freq;
    return 0;
}

// ---- entry points --------------------------------------------------------------------------

static bool has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

// ---- dummy weights (--load-format dummy) ---------------------------------------------------

// Placeholder data of dummy weights: marks a weight as present; never read (the runner asks
// the backend to create the values).
static const uint16_t dummy_data[8];

static void dummy_tensor(kaon_model *m, kaon_tensor *t, int ndim, int64_t d0, int64_t d1) {
    memset(t, 0, sizeof *t);
    t->dtype = KAON_BF16;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim > 1 ? d1 : 0;
    t->data = (void *)dummy_data;
    t->nbytes = (size_t)kaon_tensor_numel(t) * 2;
    m->n_params += (uint64_t)kaon_tensor_numel(t);
    m->weight_bytes += t->nbytes;
}

kaon_model *kaon_model_load_dummy(const char *path) {
    struct stat sb;
    if (!path || stat(path, &sb) != 0) {
        kaon_set_error("%s: %s", path ? path : "(null)", path ? strerror(errno) : "no path");
        return NULL;
    }
    kaon_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    snprintf(m->path, sizeof m->path, "%s", path);
    m->format = KAON_FORMAT_DUMMY;
    kaon_model_config *c = &m->cfg;
    kaon_model_config_init(c);
    if (S_ISDIR(sb.st_mode)) {
        if (kaon_hf_config_load(path, c)) goto fail;
    } else {
        size_t len = 0;
        char *text = kaon_read_file(path, (size_t)16 << 20, &len);
        int rc = text ? kaon_hf_config_parse(text, len, c) : -1;
        free(text);
        if (rc) goto fail;
    }
    if (kaon_model_config_validate(c)) goto fail;
    const int64_t dim = c->hidden_size, ffn = c->intermediate_size, V = c->vocab_size;
    const int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    dummy_tensor(m, &m->tok_embd, 2, V, dim);
    dummy_tensor(m, &m->out_norm, 1, dim, 0);
    if (c->tie_word_embeddings) m->lm_head = m->tok_embd;
    else dummy_tensor(m, &m->lm_head, 2, V, dim);
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        kaon_set_error("out of memory");
        goto fail;
    }
    for (int l = 0; l < c->n_layers; l++) {
        kaon_layer_weights *w = &m->layers[l];
        dummy_tensor(m, &w->attn_norm, 1, dim, 0);
        dummy_tensor(m, &w->wq, 2, qd, dim);
        dummy_tensor(m, &w->wk, 2, kvd, dim);
        dummy_tensor(m, &w->wv, 2, kvd, dim);
        dummy_tensor(m, &w->wo, 2, dim, qd);
        if (c->attention_bias) {
            dummy_tensor(m, &w->bq, 1, qd, 0);
            dummy_tensor(m, &w->bk, 1, kvd, 0);
            dummy_tensor(m, &w->bv, 1, kvd, 0);
        }
        if (c->qk_norm) {
            dummy_tensor(m, &w->q_norm, 1, c->head_dim, 0);
            dummy_tensor(m, &w->k_norm, 1, c->head_dim, 0);
        }
        dummy_tensor(m, &w->ffn_norm, 1, dim, 0);
        if (kaon_config_layer_is_moe(c, l)) {
            if (kaon_moe_dummy_layer(m, l)) goto fail;
            w->moe = &m->moe[l];
            continue;
        }
        dummy_tensor(m, &w->w_gate, 2, ffn, dim);
        dummy_tensor(m, &w->w_up, 2, ffn, dim);
        dummy_tensor(m, &w->w_down, 2, dim, ffn);
    }
    if (build_rope(m)) goto fail;
    return m;
fail:
    kaon_model_free(m);
    return NULL;
}

kaon_model *kaon_model_load(const char *path) {
    if (path && !strncmp(path, "dummy:", 6)) return kaon_model_load_dummy(path + 6);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        kaon_set_error("%s: %s", path, strerror(errno));
        return NULL;
    }
    kaon_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    snprintf(m->path, sizeof m->path, "%s", path);
    if (S_ISDIR(sb.st_mode)) {
        m->format = KAON_FORMAT_SAFETENSORS;
        kaon_model_config_init(&m->cfg);
        if (kaon_hf_config_load(path, &m->cfg) || kaon_model_config_validate(&m->cfg)) goto fail;
        m->st = kaon_safetensors_open(path);
        if (!m->st) goto fail;
    } else {
        m->format = KAON_FORMAT_GGUF;
        if (!has_suffix(path, ".gguf")) KAON_DEBUG("%s: no .gguf suffix; reading it as GGUF", path);
        m->gguf = kaon_gguf_open(path);
        if (!m->gguf) goto fail;
        if (config_from_gguf(m->gguf, &m->cfg)) {
            char msg[1100];
            snprintf(msg, sizeof msg, "%s", kaon_last_error());
            kaon_set_error("%s: %s", path, msg);
            goto fail;
        }
    }
    if (load_weights(m) || widen_biases(m) || build_rope(m)) goto fail;
    return m;
fail:
    kaon_model_free(m);
    return NULL;
}

void kaon_model_free(kaon_model *m) {
    if (!m) return;
    if (m->gguf) kaon_gguf_close(m->gguf);
    if (m->st) kaon_safetensors_close(m->st);
    kaon_moe_free_model(m);
    free(m->layers);
    free(m->rope_inv_freq);
    free(m->bias_f32);
    free(m);
}

size_t kaon_model_kv_bytes_per_token(const kaon_model *m, size_t elem_bytes) {
    const kaon_model_config *c = &m->cfg;
    return 2 * (size_t)c->n_layers * (size_t)c->n_kv_heads * (size_t)c->head_dim * elem_bytes;
}
