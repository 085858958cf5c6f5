// quantization_config (config.json) and hf_quant_config.json (ModelOpt) -> kaon_quant_config.
// Layouts and sources: shared/notes/FORMATS-2.md §4-7. Only what decides how to read the
// weights is kept; keys of the wrong type are errors, unknown keys are ignored.
#include "model/quant_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "io/json_util.h"
#include "model/hf_json.h"
#include "util/err.h"

#define QC_MAX_BYTES (16u << 20)
#define QC_MAX_IGNORE 100000

static const struct {
    const char *name;
    kaon_quant_method method;
} methods[] = {
    {"fp8", KAON_QUANT_FP8},          {"compressed-tensors", KAON_QUANT_COMPRESSED_TENSORS},
    {"awq", KAON_QUANT_AWQ},          {"gptq", KAON_QUANT_GPTQ},
    {"mxfp4", KAON_QUANT_MXFP4},      {"bitsandbytes", KAON_QUANT_BITSANDBYTES},
    {"modelopt", KAON_QUANT_MODELOPT},
};

void kaon_quant_config_free(kaon_quant_config *q) {
    if (!q) return;
    for (int i = 0; i < q->n_ignore; i++) free(q->ignore[i]);
    free(q->ignore);
    memset(q, 0, sizeof *q);
}

static int get_str(const char *file, const cJSON *obj, const char *pre, const char *key, char *dst,
                   size_t cap) {
    const cJSON *j = kaon_hf_field(obj, key);
    if (!j) return 0;
    if (!cJSON_IsString(j) || !j->valuestring) return kaon_hf_type_error(file, pre, key, "a string", j);
    snprintf(dst, cap, "%s", j->valuestring);  // long values are cut: they name nothing kaon knows
    return 0;
}

static int get_obj(const char *file, const cJSON *obj, const char *pre, const char *key, const cJSON **out) {
    const cJSON *j = kaon_hf_field(obj, key);
    *out = NULL;
    if (!j) return 0;
    if (!cJSON_IsObject(j)) return kaon_hf_type_error(file, pre, key, "an object", j);
    *out = j;
    return 0;
}

// Appends a list of module names (ignore, modules_to_not_convert, exclude_modules).
static int add_ignore(const char *file, const cJSON *obj, const char *pre, const char *key,
                      kaon_quant_config *q) {
    const cJSON *j = kaon_hf_field(obj, key);
    if (!j) return 0;
    if (!cJSON_IsArray(j)) return kaon_hf_type_error(file, pre, key, "a list of module names", j);
    const int n = cJSON_GetArraySize(j);
    if (n > QC_MAX_IGNORE - q->n_ignore)
        return kaon_set_error("%s: \"%s%s\" lists %d modules (kaon keeps at most %d)", file, pre, key, n,
                              QC_MAX_IGNORE);
    char **list = realloc(q->ignore, sizeof *list * (size_t)(q->n_ignore + n + 1));
    if (!list) return kaon_set_error("%s: out of memory", file);
    q->ignore = list;
    int i = 0;
    for (const cJSON *e = j->child; e; e = e->next, i++) {
        if (!cJSON_IsString(e) || !e->valuestring)
            return kaon_set_error("%s: \"%s%s\"[%d] must be a module name (got %s)", file, pre, key, i,
                                  kaon_json_type_name(e));
        if (!(q->ignore[q->n_ignore] = strdup(e->valuestring))) return kaon_set_error("%s: out of memory", file);
        q->n_ignore++;
    }
    return 0;
}

// A list of two positive integers (weight_block_size, block_structure).
static int get_block(const char *file, const cJSON *obj, const char *pre, const char *key, int *b, bool *set) {
    const cJSON *j = kaon_hf_field(obj, key);
    *set = false;
    if (!j) return 0;
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != 2)
        return kaon_hf_type_error(file, pre, key, "a list of two integers", j);
    int i = 0;
    for (const cJSON *e = j->child; e; e = e->next, i++) {
        const double d = cJSON_IsNumber(e) ? e->valuedouble : 0;
        if (!(d >= 1 && d <= 65536) || d != (double)(int)d)
            return kaon_set_error("%s: \"%s%s\"[%d] must be a positive integer", file, pre, key, i);
        b[i] = (int)d;
    }
    *set = true;
    return 0;
}

static int parse_act_scheme(const char *file, const cJSON *qc, const char *pre, kaon_quant_config *q) {
    char s[16] = "";
    if (get_str(file, qc, pre, "activation_scheme", s, sizeof s)) return -1;
    if (!s[0] || !strcmp(s, "dynamic")) q->act = KAON_QACT_DYNAMIC;
    else if (!strcmp(s, "static")) q->act = KAON_QACT_STATIC;
    else return kaon_set_error("%s: \"%sactivation_scheme\" = '%s' (kaon knows dynamic and static)", file, pre, s);
    return 0;
}

static int parse_fp8(const char *file, const cJSON *qc, const char *pre, kaon_quant_config *q) {
    bool set;
    snprintf(q->fp8_fmt, sizeof q->fp8_fmt, "e4m3");
    q->bits = 8;
    if (get_str(file, qc, pre, "fmt", q->fp8_fmt, sizeof q->fp8_fmt) || parse_act_scheme(file, qc, pre, q) ||
        get_block(file, qc, pre, "weight_block_size", q->block, &set) ||
        add_ignore(file, qc, pre, "modules_to_not_convert", q) || add_ignore(file, qc, pre, "ignored_layers", q))
        return -1;
    q->format = set ? KAON_QFMT_FP8_BLOCK : KAON_QFMT_FP8_TENSOR;  // transformers: no block = per tensor
    return 0;
}

// AWQ and GPTQ: integer weights in groups (AutoAWQ also writes w_bit / q_group_size).
static int parse_int_groups(const char *file, const cJSON *qc, const char *pre, kaon_quant_config *q) {
    q->format = KAON_QFMT_INT;
    q->bits = 4;
    q->group_size = 128;
    bool zero_point = true;
    q->symmetric = q->method == KAON_QUANT_GPTQ;
    if (kaon_hf_get_int(file, qc, pre, "bits", &q->bits, NULL) ||
        kaon_hf_get_int(file, qc, pre, "w_bit", &q->bits, NULL) ||
        kaon_hf_get_int(file, qc, pre, "group_size", &q->group_size, NULL) ||
        kaon_hf_get_int(file, qc, pre, "q_group_size", &q->group_size, NULL) ||
        kaon_hf_get_bool(file, qc, "desc_act", &q->desc_act) || kaon_hf_get_bool(file, qc, "sym", &q->symmetric) ||
        kaon_hf_get_bool(file, qc, "zero_point", &zero_point) ||
        add_ignore(file, qc, pre, "modules_to_not_convert", q) ||
        get_str(file, qc, pre, q->method == KAON_QUANT_AWQ ? "version" : "checkpoint_format", q->int_format,
                sizeof q->int_format))
        return -1;
    if (q->method == KAON_QUANT_AWQ) q->symmetric = !zero_point;
    return 0;
}

// compressed-tensors: the first config group's weights and input activations decide.
static int parse_compressed(const char *file, const cJSON *qc, const char *pre, kaon_quant_config *q) {
    const cJSON *groups, *g = NULL, *w = NULL, *in = NULL;
    if (get_str(file, qc, pre, "format", q->ct_format, sizeof q->ct_format) ||
        get_obj(file, qc, pre, "config_groups", &groups) || add_ignore(file, qc, pre, "ignore", q))
        return -1;
    q->format = KAON_QFMT_UNKNOWN;
    if (!groups) return 0;
    q->n_groups = cJSON_GetArraySize(groups);
    g = groups->child;
    if (!g) return 0;
    char gp[96];
    snprintf(gp, sizeof gp, "%sconfig_groups.%.40s.", pre, g->string ? g->string : "?");
    if (!cJSON_IsObject(g)) return kaon_set_error("%s: \"%.*s\" must be an object", file, (int)strlen(gp) - 1, gp);
    if (get_obj(file, g, gp, "weights", &w) || get_obj(file, g, gp, "input_activations", &in)) return -1;
    if (!w) return 0;
    char wp[112];
    snprintf(wp, sizeof wp, "%sweights.", gp);
    char type[16] = "int", strategy[16] = "";
    bool set;
    q->bits = 8;
    q->symmetric = true;
    if (kaon_hf_get_int(file, w, wp, "num_bits", &q->bits, NULL) || get_str(file, w, wp, "type", type, sizeof type) ||
        get_str(file, w, wp, "strategy", strategy, sizeof strategy) ||
        kaon_hf_get_int(file, w, wp, "group_size", &q->group_size, NULL) ||
        kaon_hf_get_bool(file, w, "symmetric", &q->symmetric) ||
        get_block(file, w, wp, "block_structure", q->block, &set))
        return -1;
    if (in) {
        bool dyn = false;
        char ip[128];
        snprintf(ip, sizeof ip, "%sinput_activations.", gp);
        if (kaon_hf_get_bool(file, in, "dynamic", &dyn) ||
            get_str(file, in, ip, "strategy", q->act_strategy, sizeof q->act_strategy))
            return -1;
        q->act = dyn ? KAON_QACT_DYNAMIC : KAON_QACT_STATIC;
    }
    snprintf(q->w_strategy, sizeof q->w_strategy, "%s", strategy);
    if (!strcmp(type, "float") && q->bits == 8) {
        snprintf(q->fp8_fmt, sizeof q->fp8_fmt, "e4m3");
        q->format = !strcmp(strategy, "block") ? KAON_QFMT_FP8_BLOCK
                    : !strcmp(strategy, "channel") ? KAON_QFMT_FP8_CHANNEL
                    : !strcmp(strategy, "tensor") ? KAON_QFMT_FP8_TENSOR
                                                  : KAON_QFMT_UNKNOWN;
    } else if (!strcmp(type, "int")) {
        q->format = KAON_QFMT_INT;
        if (strcmp(strategy, "group")) q->group_size = -1;  // channel / tensor: not in groups
    }
    return 0;
}

static int parse_bnb(const char *file, const cJSON *qc, const char *pre, kaon_quant_config *q) {
    bool b4 = false, b8 = false;
    if (kaon_hf_get_bool(file, qc, "load_in_4bit", &b4) || kaon_hf_get_bool(file, qc, "load_in_8bit", &b8) ||
        add_ignore(file, qc, pre, "llm_int8_skip_modules", q))
        return -1;
    q->bits = b4 ? 4 : 8;
    q->format = KAON_QFMT_UNKNOWN;
    return 0;
}

// ModelOpt's quant_algo (hf_quant_config.json's "quantization", or config.json's
// quantization_config with quant_method "modelopt").
static int parse_modelopt_fields(const char *file, const cJSON *o, const char *pre, kaon_quant_config *q) {
    char algo[32] = "";
    if (get_str(file, o, pre, "quant_algo", algo, sizeof algo) ||
        get_str(file, o, pre, "kv_cache_quant_algo", q->kv_cache, sizeof q->kv_cache) ||
        add_ignore(file, o, pre, "exclude_modules", q) || add_ignore(file, o, pre, "ignore", q))
        return -1;
    q->method = KAON_QUANT_MODELOPT;
    snprintf(q->method_name, sizeof q->method_name, "modelopt %.22s", algo[0] ? algo : "?");
    if (!strcmp(algo, "FP8")) {  // per-tensor weight and static input scales
        q->format = KAON_QFMT_FP8_TENSOR;
        snprintf(q->fp8_fmt, sizeof q->fp8_fmt, "e4m3");
        q->bits = 8;
        q->act = KAON_QACT_STATIC;
    } else {
        q->format = KAON_QFMT_UNKNOWN;
    }
    return 0;
}

static int parse_qc(const char *file, const cJSON *qc, kaon_quant_config *q) {
    const char *pre = "quantization_config.";
    if (!cJSON_IsObject(qc)) return kaon_hf_type_error(file, "", "quantization_config", "an object", qc);
    snprintf(q->source, sizeof q->source, "config.json");
    if (get_str(file, qc, pre, "quant_method", q->method_name, sizeof q->method_name)) return -1;
    if (!q->method_name[0]) return kaon_set_error("%s: \"quantization_config\" has no \"quant_method\"", file);
    q->method = KAON_QUANT_UNKNOWN;
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (!strcmp(q->method_name, methods[i].name)) q->method = methods[i].method;
    switch (q->method) {
    case KAON_QUANT_FP8: return parse_fp8(file, qc, pre, q);
    case KAON_QUANT_AWQ:
    case KAON_QUANT_GPTQ: return parse_int_groups(file, qc, pre, q);
    case KAON_QUANT_COMPRESSED_TENSORS: return parse_compressed(file, qc, pre, q);
    case KAON_QUANT_MXFP4:
        q->format = KAON_QFMT_MXFP4;
        q->bits = 4;
        q->group_size = 32;
        return add_ignore(file, qc, pre, "modules_to_not_convert", q);
    case KAON_QUANT_BITSANDBYTES: return parse_bnb(file, qc, pre, q);
    case KAON_QUANT_MODELOPT: return parse_modelopt_fields(file, qc, pre, q);
    default: q->format = KAON_QFMT_UNKNOWN; return 0;
    }
}

static int parse_json(const char *file, const char *json, size_t len, cJSON **out) {
    *out = NULL;
    if (!json) return kaon_set_error("%s: no input", file);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return kaon_set_error("%s: not valid JSON", file);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kaon_set_error("%s: not a JSON object", file);
    }
    *out = root;
    return 0;
}

static int parse_config(const char *file, const char *json, size_t len, kaon_quant_config *q) {
    memset(q, 0, sizeof *q);
    cJSON *root;
    if (parse_json(file, json, len, &root)) return -1;
    const cJSON *qc = kaon_hf_field(root, "quantization_config");
    const cJSON *tc = kaon_hf_field(root, "text_config");
    if (!qc && tc && cJSON_IsObject(tc)) qc = kaon_hf_field(tc, "quantization_config");  // Kimi-K2.5
    const int rc = qc ? parse_qc(file, qc, q) : 0;
    cJSON_Delete(root);
    return rc;
}

static int parse_modelopt(const char *file, const char *json, size_t len, kaon_quant_config *q) {
    memset(q, 0, sizeof *q);
    cJSON *root;
    if (parse_json(file, json, len, &root)) return -1;
    const cJSON *o;
    int rc = get_obj(file, root, "", "quantization", &o);
    if (!rc && !o) rc = kaon_set_error("%s: no \"quantization\" object", file);
    if (!rc) rc = parse_modelopt_fields(file, o, "quantization.", q);
    snprintf(q->source, sizeof q->source, "hf_quant_config.json");
    cJSON_Delete(root);
    return rc;
}

int kaon_quant_config_parse(const char *json, size_t len, kaon_quant_config *q) {
    return parse_config("config.json", json, len, q);
}

int kaon_quant_config_parse_modelopt(const char *json, size_t len, kaon_quant_config *q) {
    return parse_modelopt("hf_quant_config.json", json, len, q);
}

int kaon_quant_config_load(const char *dir, kaon_quant_config *q) {
    memset(q, 0, sizeof *q);
    char path[4200];
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    const bool modelopt = access(path, F_OK) == 0;
    if (!modelopt) snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len;
    char *text = kaon_read_file(path, QC_MAX_BYTES, &len);
    if (!text) return -1;
    const int rc = modelopt ? parse_modelopt(path, text, len, q) : parse_config(path, text, len, q);
    free(text);
    return rc;
}

static const char *method_label(const kaon_quant_config *q) {
    return q->method_name[0] ? q->method_name : "none";
}

const char *kaon_quant_describe(const kaon_quant_config *q, char *buf, size_t cap) {
    char dyn[48];
    snprintf(dyn, sizeof dyn, ", dynamic %s%s%sactivations", q->act_strategy[0] ? "per-" : "", q->act_strategy,
             q->act_strategy[0] ? " " : "");  // "per-token", "per-tensor" (compressed-tensors)
    const char *act = q->act == KAON_QACT_DYNAMIC ? dyn : q->act == KAON_QACT_STATIC ? ", static activations" : "";
    switch (q->format) {
    case KAON_QFMT_NONE: snprintf(buf, cap, "not quantized"); break;
    case KAON_QFMT_FP8_BLOCK:
        snprintf(buf, cap, "fp8 %s, blocks of %dx%d%s", q->fp8_fmt, q->block[0], q->block[1], act);
        break;
    case KAON_QFMT_FP8_CHANNEL: snprintf(buf, cap, "fp8 %s, per channel%s", q->fp8_fmt, act); break;
    case KAON_QFMT_FP8_TENSOR: snprintf(buf, cap, "fp8 %s, per tensor%s", q->fp8_fmt, act); break;
    case KAON_QFMT_INT:
        if (q->group_size > 0)
            snprintf(buf, cap, "%d-bit int, group %d%s%s%s", q->bits, q->group_size,
                     q->symmetric ? "" : ", zero points", q->desc_act ? ", act-order" : "", act);
        else
            snprintf(buf, cap, "%d-bit int, per %s%s%s", q->bits, !strcmp(q->w_strategy, "tensor") ? "tensor" : "channel",
                     q->symmetric ? "" : ", zero points", act);
        break;
    case KAON_QFMT_MXFP4: snprintf(buf, cap, "mxfp4, blocks of 32"); break;
    default:
        if (q->ct_format[0]) snprintf(buf, cap, "format %s", q->ct_format);
        else if (q->bits) snprintf(buf, cap, "%d-bit", q->bits);
        else snprintf(buf, cap, "unknown format");
        break;
    }
    return buf;
}

// What kaon_fp8_attach (model/fp8_weights.c) reads: FP8 e4m3 in blocks (fp8), per channel or
// per tensor (compressed-tensors float-quantized, ModelOpt FP8) with per-token, per-tensor or
// static activations.
static bool fp8_supported(const kaon_quant_config *q) {
    if (strcmp(q->fp8_fmt, "e4m3")) return false;
    if (q->method == KAON_QUANT_FP8) return q->format == KAON_QFMT_FP8_BLOCK;
    if (q->method == KAON_QUANT_MODELOPT) return q->format == KAON_QFMT_FP8_TENSOR && q->act == KAON_QACT_STATIC;
    if (q->method != KAON_QUANT_COMPRESSED_TENSORS || strcmp(q->ct_format, "float-quantized") ||
        (q->format != KAON_QFMT_FP8_CHANNEL && q->format != KAON_QFMT_FP8_TENSOR))
        return false;
    if (q->act != KAON_QACT_DYNAMIC) return true;  // weight-only or static input_scale
    return !q->act_strategy[0] || !strcmp(q->act_strategy, "token") || !strcmp(q->act_strategy, "tensor");
}

// 4-bit weight-only integers in the packings model/int4_weights.c unpacks.
static bool int4_loadable(const kaon_quant_config *q) {
    if (q->format != KAON_QFMT_INT || q->bits != 4 || q->act != KAON_QACT_NONE) return false;
    const char *f = q->int_format;
    switch (q->method) {
    case KAON_QUANT_AWQ: return (!f[0] || !strcmp(f, "gemm")) && !q->symmetric && q->group_size > 0;
    case KAON_QUANT_GPTQ: return !f[0] || !strcmp(f, "gptq") || !strcmp(f, "gptq_v2");
    case KAON_QUANT_COMPRESSED_TENSORS: return !strcmp(q->ct_format, "pack-quantized") && q->n_groups == 1;
    default: return false;
    }
}

// 8-bit integers (compressed-tensors int-quantized, RedHat's W8A8 / W8A16): symmetric, one scale
// per channel or per tensor, activations float or int8 per token, per tensor or by input_scale.
bool kaon_quant_is_int8(const kaon_quant_config *q) {
    if (q->method != KAON_QUANT_COMPRESSED_TENSORS || q->format != KAON_QFMT_INT || q->bits != 8 || !q->symmetric ||
        strcmp(q->ct_format, "int-quantized") || (strcmp(q->w_strategy, "channel") && strcmp(q->w_strategy, "tensor")))
        return false;
    if (q->act != KAON_QACT_DYNAMIC) return true;  // weight-only or static input_scale
    return !q->act_strategy[0] || !strcmp(q->act_strategy, "token") || !strcmp(q->act_strategy, "tensor");
}

int kaon_quant_config_check(const kaon_quant_config *q, const char *file) {
    if (q->method == KAON_QUANT_NONE || fp8_supported(q) || int4_loadable(q) || kaon_quant_is_int8(q)) return 0;
    if (q->method == KAON_QUANT_MXFP4 && q->format == KAON_QFMT_MXFP4) return 0;  // model/mxfp4_weights.c
    char what[128];
    return kaon_set_error("%s: quantization method '%s' (%s%s%s) is not supported yet; supported: fp8 block "
                          "(e4m3, weight_block_size), compressed-tensors float-quantized (fp8 per channel or "
                          "tensor), modelopt FP8, 4-bit weight-only awq (gemm), gptq, compressed-tensors "
                          "pack-quantized, compressed-tensors int-quantized (int8 per channel or tensor), mxfp4",
                          file, method_label(q), kaon_quant_describe(q, what, sizeof what),
                          q->int_format[0] ? ", " : "", q->int_format);
}

// Glob with '*' (any run of characters) over the whole of s[0, n). Only the last '*' is ever
// retried (a later '*' covers whatever an earlier one would give up), so the time is at most
// pattern x name: a recursive retry of every '*' was exponential ("****...x", found by fuzz_hf_config).
static bool glob_n(const char *p, const char *s, size_t n) {
    const char *star = NULL;
    size_t i = 0, retry = 0;
    while (i < n) {
        if (*p == '*') {
            star = ++p;
            retry = i;
        } else if (*p && *p == s[i]) {
            p++;
            i++;
        } else if (star) {
            p = star;
            i = ++retry;
        } else {
            return false;
        }
    }
    while (*p == '*') p++;
    return *p == 0;
}

// The pattern matches the module, a dotted prefix of it (a parent module: "...self_attn"), or
// a dotted suffix (the name under a wrapper's prefix: "lm_head" vs "language_model.lm_head").
static bool name_matches(const char *pat, const char *mod) {
    const size_t n = strlen(mod);
    for (size_t end = n;; end--) {  // prefixes ending at a dot, and the whole name
        if ((end == n || mod[end] == '.') && glob_n(pat, mod, end)) return true;
        if (end == 0) break;
    }
    for (const char *d = strchr(mod, '.'); d; d = strchr(d + 1, '.'))
        if (glob_n(pat, d + 1, strlen(d + 1))) return true;
    return false;
}

static bool regex_matches(const char *re, const char *mod) {
    int err;
    PCRE2_SIZE off;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &err, &off, NULL);
    if (!code) return false;  // a bad pattern matches nothing (the module stays quantized)
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
    const bool hit = md && pcre2_match(code, (PCRE2_SPTR)mod, strlen(mod), 0, 0, md, NULL) >= 0;
    pcre2_match_data_free(md);
    pcre2_code_free(code);
    return hit;
}

bool kaon_quant_module_quantized(const kaon_quant_config *q, const char *module) {
    if (!q || q->method == KAON_QUANT_NONE) return false;
    for (int i = 0; i < q->n_ignore; i++) {
        const char *p = q->ignore[i];
        if (!strncmp(p, "re:", 3) ? regex_matches(p + 3, module) : name_matches(p, module)) return false;
    }
    return true;
}
