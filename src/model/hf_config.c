// Hugging Face config.json / generation_config.json -> kaon_model_config.
//
// The caller initialises the config (kaon_model_config_init) and validates it afterwards
// (kaon_model_config_validate); parsing only fills what the files say plus the defaults HF
// applies when a key is absent. A key holding JSON null counts as absent. A key of the wrong
// type, or a number that does not fit its field, is an error naming the key.
#include <float.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/json_util.h"
#include "model/arch.h"
#include "model/config.h"
#include "model/hf_json.h"
#include "util/err.h"

#define HF_MAX_CONFIG_BYTES (16u << 20)

// A key's value, or NULL when absent or null.
const cJSON *kaon_hf_field(const cJSON *obj, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    return j && !cJSON_IsNull(j) ? j : NULL;
}

int kaon_hf_type_error(const char *file, const char *prefix, const char *key, const char *want,
                       const cJSON *got) {
    return kaon_set_error("%s: \"%s%s\" must be %s (got %s)", file, prefix, key, want,
                          kaon_json_type_name(got));
}

// Optional integer in int range; *set tells whether it was there.
int kaon_hf_get_int(const char *file, const cJSON *obj, const char *prefix, const char *key,
                    int *out, bool *set) {
    const cJSON *j = kaon_hf_field(obj, key);
    if (set) *set = false;
    if (!j) return 0;
    if (!cJSON_IsNumber(j)) return kaon_hf_type_error(file, prefix, key, "an integer", j);
    double d = j->valuedouble;
    if (!(d >= INT_MIN && d <= INT_MAX) || d != (double)(int)d)
        return kaon_set_error("%s: \"%s%s\" = %g is not an integer in range", file, prefix, key, d);
    *out = (int)d;
    if (set) *set = true;
    return 0;
}

// Optional number that fits a float.
int kaon_hf_get_float(const char *file, const cJSON *obj, const char *prefix, const char *key,
                      float *out, bool *set) {
    const cJSON *j = kaon_hf_field(obj, key);
    if (set) *set = false;
    if (!j) return 0;
    if (!cJSON_IsNumber(j)) return kaon_hf_type_error(file, prefix, key, "a number", j);
    double d = j->valuedouble;
    if (!(d >= -FLT_MAX && d <= FLT_MAX))
        return kaon_set_error("%s: \"%s%s\" = %g does not fit a float", file, prefix, key, d);
    *out = (float)d;
    if (set) *set = true;
    return 0;
}

int kaon_hf_get_bool(const char *file, const cJSON *obj, const char *key, bool *out) {
    const cJSON *j = kaon_hf_field(obj, key);
    if (!j) return 0;
    if (!cJSON_IsBool(j)) return kaon_hf_type_error(file, "", key, "true or false", j);
    *out = cJSON_IsTrue(j);
    return 0;
}

int kaon_hf_get_str(const char *file, const cJSON *obj, const char *key, char *dst, size_t cap,
                    bool *set) {
    const cJSON *j = kaon_hf_field(obj, key);
    if (set) *set = false;
    if (!j) return 0;
    if (!cJSON_IsString(j) || !j->valuestring) return kaon_hf_type_error(file, "", key, "a string", j);
    if (strlen(j->valuestring) >= cap)
        return kaon_set_error("%s: \"%s\" is longer than %zu characters", file, key, cap - 1);
    strcpy(dst, j->valuestring);
    if (set) *set = true;
    return 0;
}

// eos_token_id: an integer or a list of integers (Llama 3.1 lists three).
static int get_eos(const char *file, const cJSON *obj, kaon_model_config *c) {
    const cJSON *j = kaon_hf_field(obj, "eos_token_id");
    if (!j) return 0;
    int ids[8], n = 0;
    if (cJSON_IsNumber(j)) {
        if (kaon_hf_get_int(file, obj, "", "eos_token_id", &ids[0], NULL)) return -1;
        n = 1;
    } else if (cJSON_IsArray(j)) {
        int count = cJSON_GetArraySize(j);
        if (count > 8)
            return kaon_set_error("%s: \"eos_token_id\" lists %d ids (kaon keeps at most 8)", file,
                                  count);
        for (const cJSON *e = j->child; e; e = e->next, n++) {
            double d = cJSON_IsNumber(e) ? e->valuedouble : -1.0;
            if (!(d >= 0 && d <= INT_MAX) || d != (double)(int)d)
                return kaon_set_error("%s: \"eos_token_id\"[%d] must be a token id (got %s)", file,
                                      n, kaon_json_type_name(e));
            ids[n] = (int)d;
        }
    } else {
        return kaon_hf_type_error(file, "", "eos_token_id", "an integer or a list of integers", j);
    }
    memcpy(c->eos_token_ids, ids, (size_t)n * sizeof ids[0]);
    c->n_eos_token_ids = n;
    return 0;
}

// rope_scaling (or transformers 5's flat rope_parameters): the scaling type and its keys.
static int parse_rope_scaling(const char *file, const cJSON *root, kaon_model_config *c) {
    const char *pre = "rope_scaling.";
    const cJSON *rs = kaon_hf_field(root, "rope_scaling");
    c->rope_scaling = KAON_ROPE_SCALING_NONE;
    if (!rs) {
        // transformers 5 writes {"rope_type", "rope_theta", ...} as rope_parameters; the
        // per-layer-type form (Gemma 3) is its architecture's business.
        const cJSON *rp = kaon_hf_field(root, "rope_parameters");
        if (!rp || !cJSON_IsObject(rp) || !kaon_hf_field(rp, "rope_type")) return 0;
        pre = "rope_parameters.";
        if (kaon_hf_get_float(file, rp, pre, "rope_theta", &c->rope_theta, NULL)) return -1;
        rs = rp;
    }
    if (!cJSON_IsObject(rs)) return kaon_hf_type_error(file, "", "rope_scaling", "an object", rs);
    // Newer configs write "rope_type", older ones "type".
    const cJSON *t = kaon_hf_field(rs, "rope_type");
    const char *tkey = "rope_type";
    if (!t) {
        t = kaon_hf_field(rs, "type");
        tkey = "type";
    }
    if (!t) return kaon_set_error("%s: \"%.*s\" has no \"rope_type\"", file, (int)strlen(pre) - 1, pre);
    if (!cJSON_IsString(t) || !t->valuestring) return kaon_hf_type_error(file, pre, tkey, "a string", t);
    const char *type = t->valuestring;
    bool set;
    if (!strcmp(type, "default")) return 0;
    if (!strcmp(type, "linear")) {
        c->rope_scaling = KAON_ROPE_SCALING_LINEAR;
        if (kaon_hf_get_float(file, rs, pre, "factor", &c->rope_factor, &set)) return -1;
        if (!set) return kaon_set_error("%s: linear \"rope_scaling\" needs \"factor\"", file);
        return 0;
    }
    if (!strcmp(type, "llama3")) {
        static const char *keys[] = {"factor", "low_freq_factor", "high_freq_factor"};
        float *dst[] = {&c->rope_factor, &c->rope_low_freq_factor, &c->rope_high_freq_factor};
        c->rope_scaling = KAON_ROPE_SCALING_LLAMA3;
        for (int i = 0; i < 3; i++) {
            if (kaon_hf_get_float(file, rs, pre, keys[i], dst[i], &set)) return -1;
            if (!set)
                return kaon_set_error("%s: llama3 \"rope_scaling\" needs \"%s\"", file, keys[i]);
        }
        if (kaon_hf_get_int(file, rs, pre, "original_max_position_embeddings", &c->rope_original_max_pos,
                    &set))
            return -1;
        if (!set)
            return kaon_set_error("%s: llama3 \"rope_scaling\" needs "
                                  "\"original_max_position_embeddings\"", file);
        return 0;
    }
    if (!strcmp(type, "yarn")) {
        // HF's defaults: beta_fast 32, beta_slow 1; factor from max_position_embeddings /
        // original_max_position_embeddings when absent.
        c->rope_scaling = KAON_ROPE_SCALING_YARN;
        c->rope_beta_fast = 32.0f;
        c->rope_beta_slow = 1.0f;
        bool fset, oset, aset;
        float af = 0.0f;
        if (kaon_hf_get_float(file, rs, pre, "factor", &c->rope_factor, &fset) ||
            kaon_hf_get_int(file, rs, pre, "original_max_position_embeddings", &c->rope_original_max_pos, &oset) ||
            kaon_hf_get_float(file, rs, pre, "beta_fast", &c->rope_beta_fast, NULL) ||
            kaon_hf_get_float(file, rs, pre, "beta_slow", &c->rope_beta_slow, NULL) ||
            kaon_hf_get_float(file, rs, pre, "mscale", &c->rope_mscale, NULL) ||
            kaon_hf_get_float(file, rs, pre, "mscale_all_dim", &c->rope_mscale_all_dim, NULL) ||
            kaon_hf_get_float(file, rs, pre, "attention_factor", &af, &aset))
            return -1;
        bool trunc = true;
        if (kaon_hf_get_bool(file, rs, "truncate", &trunc)) return -1;
        c->rope_yarn_no_truncate = !trunc;
        if (!oset) c->rope_original_max_pos = c->max_position_embeddings;
        if (!fset && c->rope_original_max_pos > 0)
            c->rope_factor = (float)c->max_position_embeddings / (float)c->rope_original_max_pos;
        if (!(c->rope_factor > 0.0f) || c->rope_original_max_pos <= 0)
            return kaon_set_error("%s: yarn \"rope_scaling\" needs a positive \"factor\" and "
                                  "\"original_max_position_embeddings\"", file);
        c->rope_attn_factor = aset ? af : kaon_yarn_attn_factor(c);
        return 0;
    }
    return kaon_set_error("%s: rope_scaling type '%.40s' is not supported (kaon reads llama3, yarn "
                          "and linear)", file, type);
}

static int parse_root(const char *file, const char *text, size_t len, cJSON **out) {
    // A NUL-terminated copy, so the parser never depends on the caller's buffer end.
    char *json = malloc(len + 1);
    if (!json) return kaon_set_error("%s: out of memory", file);
    memcpy(json, text, len);
    json[len] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    size_t at = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
    free(json);  // cJSON copies every string it keeps
    if (!root) return kaon_set_error("%s: not valid JSON (near byte %zu)", file, at);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kaon_set_error("%s: not a JSON object", file);
    }
    *out = root;
    return 0;
}

// A multimodal wrapper whose text model kaon runs (its config is "text_config", its tensors
// are under a prefix).
static const struct {
    const char *arch, *prefix;
} text_wrappers[] = {{"KimiK25ForConditionalGeneration", "language_model."}};

static int config_fields(const char *file, const cJSON *root, kaon_model_config *c) {
    // Architecture: architectures[0], else model_type (which matches GGUF names: llama, ...).
    const cJSON *archs = kaon_hf_field(root, "architectures");
    const cJSON *first = archs && cJSON_IsArray(archs) ? archs->child : NULL;
    for (size_t i = 0; first && cJSON_IsString(first) && i < sizeof text_wrappers / sizeof text_wrappers[0]; i++) {
        if (strcmp(first->valuestring, text_wrappers[i].arch)) continue;
        const cJSON *tc = kaon_hf_field(root, "text_config");
        if (!tc || !cJSON_IsObject(tc))
            return kaon_set_error("%s: %s needs a \"text_config\" object", file, text_wrappers[i].arch);
        snprintf(c->hf_prefix, sizeof c->hf_prefix, "%s", text_wrappers[i].prefix);
        root = tc;
        archs = kaon_hf_field(root, "architectures");
        break;
    }
    if (archs) {
        const cJSON *a0 = cJSON_IsArray(archs) ? archs->child : NULL;
        if (!a0 || !cJSON_IsString(a0) || !a0->valuestring)
            return kaon_set_error("%s: \"architectures\" must be a list of class names", file);
        if (strlen(a0->valuestring) >= sizeof c->arch_name)
            return kaon_set_error("%s: \"architectures\"[0] is longer than %zu characters", file,
                                  sizeof c->arch_name - 1);
        strcpy(c->arch_name, a0->valuestring);
    } else if (kaon_hf_get_str(file, root, "model_type", c->arch_name, sizeof c->arch_name, NULL)) {
        return -1;
    }
    // Unknown names parse (the common keys are read) and fail validation, which lists the
    // architectures kaon runs.
    c->impl = c->arch_name[0] ? kaon_arch_find(c->arch_name, &c->arch) : NULL;
    if (!c->impl) c->arch = KAON_ARCH_UNKNOWN;

    bool kv_set, hd_set, theta_set;
    if (kaon_hf_get_int(file, root, "", "num_hidden_layers", &c->n_layers, NULL) ||
        kaon_hf_get_int(file, root, "", "hidden_size", &c->hidden_size, NULL) ||
        kaon_hf_get_int(file, root, "", "intermediate_size", &c->intermediate_size, NULL) ||
        kaon_hf_get_int(file, root, "", "num_attention_heads", &c->n_heads, NULL) ||
        kaon_hf_get_int(file, root, "", "num_key_value_heads", &c->n_kv_heads, &kv_set) ||
        kaon_hf_get_int(file, root, "", "head_dim", &c->head_dim, &hd_set) ||
        kaon_hf_get_int(file, root, "", "vocab_size", &c->vocab_size, NULL) ||
        kaon_hf_get_int(file, root, "", "max_position_embeddings", &c->max_position_embeddings, NULL) ||
        kaon_hf_get_float(file, root, "", "rms_norm_eps", &c->rms_norm_eps, NULL) ||
        kaon_hf_get_float(file, root, "", "rope_theta", &c->rope_theta, &theta_set))
        return -1;
    if (!kv_set) c->n_kv_heads = c->n_heads;
    if (!hd_set) c->head_dim = c->n_heads > 0 ? c->hidden_size / c->n_heads : 0;
    if (!theta_set) c->rope_theta = 10000.0f;
    c->rope_attn_factor = 1.0f;

    c->rope_dim = c->head_dim;
    float prf;
    bool prf_set;
    if (kaon_hf_get_float(file, root, "", "partial_rotary_factor", &prf, &prf_set)) return -1;
    if (prf_set) {
        if (!(prf > 0.0f && prf <= 1.0f))
            return kaon_set_error("%s: \"partial_rotary_factor\" = %g must lie in (0, 1]", file,
                                  (double)prf);
        c->rope_dim = (int)((float)c->head_dim * prf);
    }
    c->rope_interleaved = false;  // HF checkpoints rotate NeoX pairs (j, j + head_dim/2)
    if (parse_rope_scaling(file, root, c)) return -1;

    c->tie_word_embeddings = false;
    c->attention_bias = false;
    if (kaon_hf_get_bool(file, root, "tie_word_embeddings", &c->tie_word_embeddings) ||
        kaon_hf_get_bool(file, root, "attention_bias", &c->attention_bias))
        return -1;
    if (c->impl && c->impl->hf_config && c->impl->hf_config(file, root, c)) return -1;

    bool bos_set;
    int bos;
    if (kaon_hf_get_int(file, root, "", "bos_token_id", &bos, &bos_set)) return -1;
    if (bos_set) c->bos_token_id = bos;
    if (get_eos(file, root, c)) return -1;

    bool dt_set;
    if (kaon_hf_get_str(file, root, "torch_dtype", c->torch_dtype, sizeof c->torch_dtype, &dt_set))
        return -1;
    if (!dt_set && kaon_hf_get_str(file, root, "dtype", c->torch_dtype, sizeof c->torch_dtype, NULL))
        return -1;
    return 0;
}

static int parse_config(const char *file, const char *json, size_t len, kaon_model_config *c) {
    if (!json || !c) return kaon_set_error("%s: no input", file);
    cJSON *root = NULL;
    if (parse_root(file, json, len, &root)) return -1;
    int rc = config_fields(file, root, c);
    cJSON_Delete(root);
    return rc;
}

static int parse_generation(const char *file, const char *json, size_t len,
                            kaon_model_config *c) {
    if (!json || !c) return kaon_set_error("%s: no input", file);
    cJSON *root = NULL;
    if (parse_root(file, json, len, &root)) return -1;
    // vLLM-style: sampling defaults are taken whatever "do_sample" says.
    int rc = kaon_hf_get_float(file, root, "", "temperature", &c->gen_temperature, NULL) ||
             kaon_hf_get_float(file, root, "", "top_p", &c->gen_top_p, NULL) ||
             kaon_hf_get_int(file, root, "", "top_k", &c->gen_top_k, NULL) ||
             kaon_hf_get_float(file, root, "", "min_p", &c->gen_min_p, NULL) ||
             kaon_hf_get_float(file, root, "", "repetition_penalty", &c->gen_repetition_penalty, NULL) ||
             kaon_hf_get_int(file, root, "", "max_new_tokens", &c->gen_max_new_tokens, NULL) ||
             get_eos(file, root, c);
    cJSON_Delete(root);
    return rc ? -1 : 0;
}

int kaon_hf_config_parse(const char *json, size_t len, kaon_model_config *c) {
    return parse_config("config.json", json, len, c);
}

int kaon_hf_generation_config_parse(const char *json, size_t len, kaon_model_config *c) {
    return parse_generation("generation_config.json", json, len, c);
}

int kaon_hf_config_load(const char *dir, kaon_model_config *c) {
    size_t n = strlen(dir) + 32;
    char *path = malloc(n);
    if (!path) return kaon_set_error("%s: out of memory", dir);
    snprintf(path, n, "%s/config.json", dir);
    if (access(path, F_OK) != 0) {
        free(path);
        return kaon_set_error("%s: no config.json", dir);
    }
    size_t len;
    char *text = kaon_read_file(path, HF_MAX_CONFIG_BYTES, &len);
    int rc = text ? parse_config(path, text, len, c) : -1;
    free(text);
    if (!rc) {
        snprintf(path, n, "%s/generation_config.json", dir);
        if (access(path, F_OK) == 0) {
            text = kaon_read_file(path, HF_MAX_CONFIG_BYTES, &len);
            rc = text ? parse_generation(path, text, len, c) : -1;
            free(text);
        }
    }
    free(path);
    return rc;
}
