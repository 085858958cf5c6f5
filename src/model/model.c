// Loading: map the file, describe the model (its architecture's config keys), and read its
// weights through the architecture's weight table (weights.c).
#include "model/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json_util.h"
#include "model/arch.h"
#include "model/eagle3.h"
#include "model/gguf_config.h"
#include "util/err.h"
#include "util/log.h"

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
    if (!t && m->cfg.hf_prefix[0]) {  // a wrapper's text model (Kimi-K2.5: language_model.)
        char full[512];
        snprintf(full, sizeof full, "%s%s", m->cfg.hf_prefix, name);
        t = kaon_safetensors_find(m->st, full);
    }
    if (!t) return 0;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    out->data = (void *)t->data;
    out->nbytes = t->nbytes;
    return 0;
}

// ---- RoPE frequencies ----------------------------------------------------------------------

int kaon_model_build_rope(kaon_model *m, int which, float theta, bool scaled,
                          const kaon_tensor *freq_divisors) {
    const kaon_model_config *c = &m->cfg;
    const int half = c->rope_dim / 2;
    float *inv_freq = malloc(sizeof(float) * (size_t)half);
    if (!inv_freq) return kaon_set_error("out of memory");
    free(m->rope_inv_freq[which]);
    m->rope_inv_freq[which] = inv_freq;
    const float *div = freq_divisors && freq_divisors->data ? freq_divisors->data : NULL;
    // YaRN's ramp over the rotated pairs (HF _compute_yarn_parameters with truncate): pairs below
    // `lo` keep their frequency, pairs above `hi` are divided by the factor, and between
    // the two the frequencies blend linearly.
    double lo = 0.0, hi = 0.0;
    if (scaled && c->rope_scaling == KAON_ROPE_SCALING_YARN) {
        const double d = c->rope_dim, two_ln_base = 2.0 * log((double)theta);
        lo = d * log(c->rope_original_max_pos / (c->rope_beta_fast * 2.0 * M_PI)) / two_ln_base;
        hi = d * log(c->rope_original_max_pos / (c->rope_beta_slow * 2.0 * M_PI)) / two_ln_base;
        if (!c->rope_yarn_no_truncate) {  // HF's default; gpt-oss sets truncate: false
            lo = floor(lo);
            hi = ceil(hi);
        }
        if (lo < 0) lo = 0;
        if (hi > d - 1) hi = d - 1;
        if (lo == hi) hi += 0.001;
    }
    for (int j = 0; j < half; j++) {
        double inv = pow((double)theta, -2.0 * j / c->rope_dim);
        if (scaled && c->rope_scaling == KAON_ROPE_SCALING_LINEAR) {
            inv /= c->rope_factor;
        } else if (scaled && c->rope_scaling == KAON_ROPE_SCALING_LLAMA3) {
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
        } else if (scaled && c->rope_scaling == KAON_ROPE_SCALING_YARN) {
            double r = (j - lo) / (hi - lo);
            r = r < 0 ? 0 : r > 1 ? 1 : r;
            inv = inv / c->rope_factor * r + inv * (1.0 - r);
        }
        if (div) inv /= div[j];
        inv_freq[j] = (float)inv;
    }
    m->rope[which].rot_dim = c->rope_dim;
    m->rope[which].interleaved = c->rope_interleaved;
    m->rope[which].inv_freq = inv_freq;
    return 0;
}

// ---- entry points --------------------------------------------------------------------------

static bool has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

static kaon_model *new_model(const char *path, kaon_model_format format) {
    kaon_model *m = calloc(1, sizeof *m);
    if (!m) {
        kaon_set_error("out of memory");
        return NULL;
    }
    snprintf(m->path, sizeof m->path, "%s", path);
    m->format = format;
    return m;
}

// The weights through the architecture's table, then what the architecture derives from them.
// mtp: the checkpoint's first MTP layer is loaded too, as layer n_layers (speculative decoding's
// draft model: model/arch.h draft_forward).
static int finish(kaon_model *m, bool mtp) {
    m->arch = m->cfg.impl;
    if (mtp) {
        kaon_model_config *c = &m->cfg;
        if (!m->arch->draft_forward || c->n_nextn_layers < 1 || m->gguf)
            return kaon_set_error("%s: speculative method mtp needs a DeepSeek-V3/R1 Hugging Face checkpoint with "
                                  "num_nextn_predict_layers >= 1 (this one: %s, %d MTP layers%s)", m->path,
                                  m->arch->label, c->n_nextn_layers, m->gguf ? ", GGUF" : "");
        c->n_mtp_layers = 1;  // V3/R1 have one; chained drafts reuse it
        c->n_layers += c->n_mtp_layers;
    }
    int rc = m->format == KAON_FORMAT_DUMMY ? kaon_weights_load_dummy(m) : kaon_weights_load(m);
    if (!rc && m->arch->prepare) rc = m->arch->prepare(m);
    return rc;
}

static kaon_model *load_dummy(const char *path, bool mtp) {
    struct stat sb;
    if (!path || stat(path, &sb) != 0) {
        kaon_set_error("%s: %s", path ? path : "(null)", path ? strerror(errno) : "no path");
        return NULL;
    }
    kaon_model *m = new_model(path, KAON_FORMAT_DUMMY);
    if (!m) return NULL;
    kaon_model_config *c = &m->cfg;
    kaon_model_config_init(c);
    // The quantization config too: dummy FP8 weights take its format (fp8_weights.h).
    char qfile[4200];
    if (S_ISDIR(sb.st_mode)) {
        if (kaon_hf_config_load(path, c) || kaon_quant_config_load(path, &m->quant)) goto fail;
        snprintf(qfile, sizeof qfile, "%s/%s", path, m->quant.source);
    } else {
        size_t len = 0;
        char *text = kaon_read_file(path, (size_t)16 << 20, &len);
        int rc = text ? kaon_hf_config_parse(text, len, c) : -1;
        if (!rc) rc = kaon_quant_config_parse(text, len, &m->quant);
        free(text);
        if (rc) goto fail;
        snprintf(qfile, sizeof qfile, "%s", path);
    }
    // A quantization dummy weights cannot take (INT4, MXFP4, ...) leaves them bf16, as before.
    if (kaon_quant_config_check(&m->quant, qfile)) kaon_quant_config_free(&m->quant);
    if (kaon_model_config_validate(c) || finish(m, mtp)) goto fail;
    return m;
fail:
    kaon_model_free(m);
    return NULL;
}

kaon_model *kaon_model_load_dummy(const char *path) { return load_dummy(path, false); }

static kaon_model *load(const char *path, bool mtp) {
    if (path && !strncmp(path, "dummy:", 6)) return load_dummy(path + 6, mtp);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        kaon_set_error("%s: %s", path, strerror(errno));
        return NULL;
    }
    kaon_model *m = new_model(path, S_ISDIR(sb.st_mode) ? KAON_FORMAT_SAFETENSORS : KAON_FORMAT_GGUF);
    if (!m) return NULL;
    if (S_ISDIR(sb.st_mode)) {
        kaon_model_config_init(&m->cfg);
        if (kaon_hf_config_load(path, &m->cfg) || kaon_model_config_validate(&m->cfg)) goto fail;
        // Before the tensors: an unsupported quantization is named, never read as garbage.
        char qfile[4200];
        if (kaon_quant_config_load(path, &m->quant)) goto fail;
        snprintf(qfile, sizeof qfile, "%s/%s", path, m->quant.source);
        if (kaon_quant_config_check(&m->quant, qfile)) goto fail;
        m->st = kaon_safetensors_open(path);
        if (!m->st) goto fail;
    } else {
        if (!has_suffix(path, ".gguf")) KAON_DEBUG("%s: no .gguf suffix; reading it as GGUF", path);
        m->gguf = kaon_gguf_open(path);
        if (!m->gguf) goto fail;
        if (kaon_gguf_config(m->gguf, &m->cfg)) {
            char msg[1100];
            snprintf(msg, sizeof msg, "%s", kaon_last_error());
            kaon_set_error("%s: %s", path, msg);
            goto fail;
        }
    }
    if (finish(m, mtp)) goto fail;
    return m;
fail:
    kaon_model_free(m);
    return NULL;
}

kaon_model *kaon_model_load(const char *path) { return load(path, false); }
kaon_model *kaon_model_load_mtp(const char *path) { return load(path, true); }

void kaon_model_free(kaon_model *m) {
    if (!m) return;
    if (m->arch) kaon_weights_free_host(m);
    kaon_eagle3_free(m->eagle3);
    if (m->gguf) kaon_gguf_close(m->gguf);
    if (m->st) kaon_safetensors_close(m->st);
    kaon_quant_config_free(&m->quant);
    for (int i = 0; i < 2; i++) free(m->rope_inv_freq[i]);
    free(m);
}

bool kaon_model_layer_is_moe(const kaon_model *m, int l) {
    return m->w.layer_moe && l >= 0 && l < m->cfg.n_layers && m->w.layer_moe[l];
}

size_t kaon_model_kv_bytes_per_token(const kaon_model *m, size_t elem_bytes) {
    const kaon_model_config *c = &m->cfg;
    size_t elems = 0;
    for (int l = 0; l < c->n_layers; l++) {
        size_t k = (size_t)c->n_kv_heads * c->head_dim, v = k;
        if (m->arch && m->arch->kv_spec) m->arch->kv_spec(c, l, &k, &v);
        elems += k + v;
    }
    if (m->eagle3) elems += 2 * (size_t)m->eagle3->head->cfg.n_kv_heads * m->eagle3->head->cfg.head_dim;
    return elems * elem_bytes;
}
