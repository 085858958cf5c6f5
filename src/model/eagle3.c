// EAGLE-3 draft heads (eagle3.h): the head's config and weight table, loading it next to its
// target, and its step.
#include "model/eagle3.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json_util.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/hf_json.h"
#include "model/model.h"
#include "util/err.h"

typedef struct eagle_globals {
    kaon_linear fc;          // [dim, 3 dim] over the target's three hidden states
    kaon_tensor norm;        // [dim]
    kaon_linear lm_head;     // [draft_vocab, dim]
    kaon_linear tok_embd;    // [vocab, dim]; w.data NULL: the target's embedding is shared
} eagle_globals;

typedef struct eagle_layer {
    kaon_tensor attn_norm, hidden_norm;  // [dim] each: the embedding's and g's norms
    kaon_linear wq, wk, wv, wo;          // q/k/v read [embedding | g] (2 dim)
    kaon_tensor ffn_norm;
    kaon_linear w_gate, w_up, w_down;
} eagle_layer;

#define G(f) false, offsetof(eagle_globals, f)
#define L(f) true, offsetof(eagle_layer, f)
enum { HID = KAON_DIM_HIDDEN, HID2 = KAON_DIM_HIDDEN2, Q = KAON_DIM_Q, KV = KAON_DIM_KV, FFN = KAON_DIM_FFN };

// The layer is `midlayer.` in EAGLE's and SpecForge's files, `layers.0.` in some conversions:
// one table for each (a head has one layer, so %d never matters).
#define EAGLE_TABLE(P)                                                                                           \
    {NULL, "fc.weight", G(fc.w), 2, {HID, KAON_DIM_HIDDEN3}, KAON_WHEN_ALWAYS, 0, 0},                            \
    {NULL, "norm.weight", G(norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},                                  \
    {NULL, "lm_head.weight", G(lm_head.w), 2, {KAON_DIM_DRAFT_VOCAB, HID}, KAON_WHEN_ALWAYS, 0, 0},              \
    {NULL, "embed_tokens.weight", G(tok_embd.w), 2, {KAON_DIM_VOCAB, HID}, KAON_WHEN_OPTIONAL, 0, 0},            \
    {NULL, P "input_layernorm.weight", L(attn_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},                \
    {NULL, P "hidden_norm.weight", L(hidden_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},                  \
    {NULL, P "self_attn.q_proj.weight", L(wq.w), 2, {Q, HID2}, KAON_WHEN_ALWAYS, 0, 0},                          \
    {NULL, P "self_attn.k_proj.weight", L(wk.w), 2, {KV, HID2}, KAON_WHEN_ALWAYS, 0, 0},                         \
    {NULL, P "self_attn.v_proj.weight", L(wv.w), 2, {KV, HID2}, KAON_WHEN_ALWAYS, 0, 0},                         \
    {NULL, P "self_attn.o_proj.weight", L(wo.w), 2, {HID, Q}, KAON_WHEN_ALWAYS, 0, 0},                           \
    {NULL, P "post_attention_layernorm.weight", L(ffn_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},        \
    {NULL, P "mlp.gate_proj.weight", L(w_gate.w), 2, {FFN, HID}, KAON_WHEN_ALWAYS, 0, 0},                        \
    {NULL, P "mlp.up_proj.weight", L(w_up.w), 2, {FFN, HID}, KAON_WHEN_ALWAYS, 0, 0},                            \
    {NULL, P "mlp.down_proj.weight", L(w_down.w), 2, {HID, FFN}, KAON_WHEN_ALWAYS, 0, 0},

static const kaon_weight_spec weights_midlayer[] = {EAGLE_TABLE("midlayer.")};
static const kaon_weight_spec weights_layers0[] = {EAGLE_TABLE("layers.0.")};

// cfg.arch_params[NORM_BEFORE_RESIDUAL]: 1 when the config's norm_before_residual is true.
enum { NORM_BEFORE_RESIDUAL = 0 };

static int prepare(kaon_model *m) {
    return kaon_model_build_rope(m, KAON_ROPE_GLOBAL, m->cfg.rope_theta, true, NULL);
}

// ---- the step ------------------------------------------------------------------------------

// f->hin: [T, 3 dim] target hidden states (f->draft_fc) or [T, dim] the head's own outputs;
// f->hidden_out receives h' (before the norm) for the next chained pass.
static void draft_forward(kaon_fwd *f, const kaon_batch *b) {
    const kaon_model_config *c = f->c;
    const kaon_backend_ops *op = f->op;
    const eagle_globals *g = f->w->globals;
    const eagle_layer *w = f->w->layers;
    const int T = b->n_tokens, dim = c->hidden_size;
    const size_t eb = op->act_elem_bytes, D = (size_t)dim;
    char *cat = f->dcat;  // [T, 2 dim]
    if (f->draft_fc) op->linear(f->be, f->hin, T, &g->fc, f->a.x);          // g = fc(a) [T, dim]
    else op->copy_strided(f->be, f->hin, D, f->a.x, D, T, dim, 1.0f);       // g = h'
    op->rmsnorm(f->be, f->a.x, NULL, &w->hidden_norm, c->rms_norm_eps, T, dim, f->a.xn);
    op->copy_strided(f->be, f->a.xn, D, cat + eb * D, 2 * D, T, dim, 1.0f);
    if (c->arch_params[NORM_BEFORE_RESIDUAL] != 0.0f)  // the residual is hidden_norm(g), not g
        op->copy_strided(f->be, f->a.xn, D, f->a.x, D, T, dim, 1.0f);
    const kaon_linear *embd = g->tok_embd.w.data ? &g->tok_embd : f->draft_embed;
    op->embed(f->be, &embd->w, b->tokens, T, f->a.proj);
    op->rmsnorm(f->be, f->a.proj, NULL, &w->attn_norm, c->rms_norm_eps, T, dim, f->a.xn);
    op->copy_strided(f->be, f->a.xn, D, cat, 2 * D, T, dim, 1.0f);
    f->pending = false;
    const kaon_linear *qkv[3] = {&w->wq, &w->wk, &w->wv};
    void *out[3] = {f->a.q, f->a.k, f->a.v};
    for (int i = 0; i < 3; i++) op->linear(f->be, cat, T, qkv[i], out[i]);
    kaon_blk_attention(f, b, 0, &f->m->rope[KAON_ROPE_GLOBAL], 0, 1.0f / sqrtf((float)c->head_dim));
    kaon_blk_out(f, b, &w->wo, f->a.att);                        // h = g + proj (pending)
    kaon_blk_norm(f, b, &w->ffn_norm);
    kaon_blk_mlp(f, b, KAON_ACT_SILU, &w->w_gate, &w->w_up, &w->w_down);
    kaon_blk_norm(f, b, &g->norm);                               // x = h', xn = norm(h')
    if (f->hidden_out) op->copy_strided(f->be, f->a.x, D, f->hidden_out, D, T, dim, 1.0f);
    if (b->n_logits == 0) return;
    op->get_rows(f->be, f->a.xn, b->logit_rows, b->n_logits, dim, f->a.rows);
    if (f->logits_f32) op->linear_f32(f->be, f->a.rows, b->n_logits, &g->lm_head, f->a.logits);
    else op->linear(f->be, f->a.rows, b->n_logits, &g->lm_head, f->a.logits);
}

static const kaon_arch_name names[] = {{"Eagle3", KAON_ARCH_LLAMA}, {NULL, KAON_ARCH_UNKNOWN}};

// Not in the registry: a head is only ever loaded by kaon_eagle3_attach.
static const kaon_arch_ops arch_midlayer = {
    .label = "eagle3",
    .names = names,
    .weights = weights_midlayer,
    .n_weights = sizeof weights_midlayer / sizeof weights_midlayer[0],
    .globals_size = sizeof(eagle_globals),
    .layer_size = sizeof(eagle_layer),
    .prepare = prepare,
    .draft_forward = draft_forward,
};
static const kaon_arch_ops arch_layers0 = {
    .label = "eagle3",
    .names = names,
    .weights = weights_layers0,
    .n_weights = sizeof weights_layers0 / sizeof weights_layers0[0],
    .globals_size = sizeof(eagle_globals),
    .layer_size = sizeof(eagle_layer),
    .prepare = prepare,
    .draft_forward = draft_forward,
};

// ---- loading --------------------------------------------------------------------------------

// The head's config.json: a one-layer Llama config (LlamaForCausalLM in EAGLE's files,
// LlamaForCausalLMEagle3 in SpecForge's) plus draft_vocab_size, target_hidden_size and
// eagle_config.eagle_aux_hidden_state_layer_ids.
static int head_config(const char *file, const kaon_model *t, kaon_model *h, kaon_eagle3 *e) {
    size_t len = 0;
    char *text = kaon_read_file(file, (size_t)1 << 20, &len);
    if (!text) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kaon_set_error("%s: not a JSON object", file);
    }
    int rc = -1;
    const cJSON *archs = kaon_hf_field(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    const char *an = cJSON_IsString(a0) ? a0->valuestring : "";
    if (strcmp(an, "LlamaForCausalLM") && strcmp(an, "LlamaForCausalLMEagle3")) {
        kaon_set_error("%s: an EAGLE-3 head has architectures [\"LlamaForCausalLM\"] or [\"LlamaForCausalLMEagle3\"], "
                       "not [\"%s\"]", file, an);
        goto done;
    }
    // The common keys through the Llama reader, under the name it knows.
    cJSON_ReplaceItemInObjectCaseSensitive(root, "architectures", cJSON_CreateStringArray((const char *[]){"LlamaForCausalLM"}, 1));
    char *plain = cJSON_PrintUnformatted(root);
    kaon_model_config *c = &h->cfg;
    kaon_model_config_init(c);
    int prc = plain ? kaon_hf_config_parse(plain, strlen(plain), c) : kaon_set_error("out of memory");
    free(plain);
    if (prc || kaon_model_config_validate(c)) goto done;
    const kaon_model_config *tc = &t->cfg;
    int target_hidden = c->hidden_size;
    c->draft_vocab_size = c->vocab_size;
    if (kaon_hf_get_int(file, root, "", "draft_vocab_size", &c->draft_vocab_size, NULL) ||
        kaon_hf_get_int(file, root, "", "target_hidden_size", &target_hidden, NULL))
        goto done;
    bool nbr = false;
    if (kaon_hf_get_bool(file, root, "norm_before_residual", &nbr)) goto done;
    c->arch_params[NORM_BEFORE_RESIDUAL] = nbr ? 1.0f : 0.0f;
    if (c->n_layers != 1) {
        kaon_set_error("%s: kaon runs one-layer EAGLE-3 heads (num_hidden_layers %d)", file, c->n_layers);
        goto done;
    }
    if (c->hidden_size != tc->hidden_size || target_hidden != tc->hidden_size) {
        kaon_set_error("%s: the head's hidden size %d (target_hidden_size %d) does not match the target's %d", file,
                       c->hidden_size, target_hidden, tc->hidden_size);
        goto done;
    }
    // The head runs in the target's activation buffers: the same attention shape, an MLP no wider.
    if (c->n_heads != tc->n_heads || c->n_kv_heads != tc->n_kv_heads || c->head_dim != tc->head_dim ||
        c->intermediate_size > tc->intermediate_size || c->vocab_size != tc->vocab_size) {
        kaon_set_error("%s: the head (%d heads, %d KV heads of %d, intermediate %d, vocab %d) does not fit the target "
                       "(%d, %d of %d, %d, %d)", file, c->n_heads, c->n_kv_heads, c->head_dim, c->intermediate_size,
                       c->vocab_size, tc->n_heads, tc->n_kv_heads, tc->head_dim, tc->intermediate_size, tc->vocab_size);
        goto done;
    }
    if (c->draft_vocab_size < 1 || c->draft_vocab_size > c->vocab_size) {
        kaon_set_error("%s: draft_vocab_size %d must be in [1, %d]", file, c->draft_vocab_size, c->vocab_size);
        goto done;
    }
    // Default: the states entering layers 2, N/2 and N-3. Configs name the layers whose OUTPUT
    // is taken, i.e. the input of the next one (SGLang adds 1 the same way).
    const int N = tc->n_layers;
    e->aux_layers[0] = 2, e->aux_layers[1] = N / 2, e->aux_layers[2] = N - 3;
    const cJSON *ec = kaon_hf_field(root, "eagle_config");
    const cJSON *ids = ec ? kaon_hf_field(ec, "eagle_aux_hidden_state_layer_ids") : NULL;
    if (ids) {
        if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) != 3) {
            kaon_set_error("%s: eagle_config.eagle_aux_hidden_state_layer_ids must list 3 layers", file);
            goto done;
        }
        for (int i = 0; i < 3; i++) {
            const cJSON *v = cJSON_GetArrayItem(ids, i);
            e->aux_layers[i] = cJSON_IsNumber(v) ? (int)v->valuedouble + 1 : -1;
        }
    }
    for (int i = 0; i < 3; i++)
        if (e->aux_layers[i] < 0 || e->aux_layers[i] >= N) {
            kaon_set_error("%s: auxiliary hidden state %d comes from layer %d, outside the target's %d layers", file, i,
                           e->aux_layers[i], N);
            goto done;
        }
    c->impl = &arch_midlayer;
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

// d2t from the file (int64 offsets), or made up for a dummy head: draft ids spread over the
// target vocabulary (any valid mapping serves a benchmark).
static int load_d2t(kaon_model *h, kaon_eagle3 *e) {
    const int n = h->cfg.draft_vocab_size, V = h->cfg.vocab_size;
    e->d2t = calloc((size_t)n, sizeof *e->d2t);
    if (!e->d2t) return kaon_set_error("out of memory");
    if (h->format == KAON_FORMAT_DUMMY) {
        for (int d = 0; d < n; d++) e->d2t[d] = (int32_t)((int64_t)d * (V / n) - d);
        return 0;
    }
    kaon_tensor t;
    if (kaon_model_find_tensor(h, "d2t", &t)) return -1;
    if (!t.data) {
        if (n == V) return 0;  // the same vocabulary: no mapping
        return kaon_set_error("%s: no d2t tensor (draft_vocab_size %d < vocab_size %d)", h->path, n, V);
    }
    if ((t.dtype != KAON_I64 && t.dtype != KAON_I32) || t.ndim != 1 || t.shape[0] != n)
        return kaon_set_error("%s: d2t must be an integer vector of %d (draft_vocab_size)", h->path, n);
    for (int d = 0; d < n; d++) {
        const int64_t id = d + kaon_tensor_int_at(&t, d);
        if (id < 0 || id >= V) return kaon_set_error("%s: d2t[%d] maps to %lld, outside the vocabulary", h->path, d, (long long)id);
        e->d2t[d] = (int32_t)(id - d);
    }
    return 0;
}

int kaon_eagle3_attach(kaon_model *t, const char *path) {
    if (!path || !path[0]) return kaon_set_error("speculative method eagle3 needs \"model\": the EAGLE-3 head's folder");
    if (!t->arch || strcmp(t->arch->label, "llama") || t->cfg.n_experts > 0 || t->cfg.n_mtp_layers)
        return kaon_set_error("speculative method eagle3: the target must be a dense Llama-family model (this one: %s%s)",
                              t->arch ? t->arch->label : "?", t->cfg.n_experts > 0 ? ", mixture of experts" : "");
    struct stat sb;
    if (stat(path, &sb) != 0) return kaon_set_error("EAGLE-3 head %s: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return kaon_set_error("EAGLE-3 head %s: not a folder (config.json and safetensors)", path);
    kaon_eagle3 *e = calloc(1, sizeof *e);
    kaon_model *h = e ? calloc(1, sizeof *h) : NULL;
    if (!h) {
        free(e);
        return kaon_set_error("out of memory");
    }
    e->head = h;
    snprintf(h->path, sizeof h->path, "%s", path);
    h->format = t->format == KAON_FORMAT_DUMMY ? KAON_FORMAT_DUMMY : KAON_FORMAT_SAFETENSORS;
    char file[4200];
    snprintf(file, sizeof file, "%s/config.json", path);
    if (head_config(file, t, h, e)) goto fail;
    if (h->format != KAON_FORMAT_DUMMY) {
        if (!(h->st = kaon_safetensors_open(path))) goto fail;
        if (!kaon_safetensors_find(h->st, "midlayer.hidden_norm.weight") &&
            kaon_safetensors_find(h->st, "layers.0.hidden_norm.weight"))
            h->cfg.impl = &arch_layers0;
    }
    h->arch = h->cfg.impl;
    if ((h->format == KAON_FORMAT_DUMMY ? kaon_weights_load_dummy(h) : kaon_weights_load(h)) || prepare(h) ||
        load_d2t(h, e))
        goto fail;
    t->eagle3 = e;
    return 0;
fail:
    kaon_eagle3_free(e);
    return -1;
}

void kaon_eagle3_free(kaon_eagle3 *e) {
    if (!e) return;
    kaon_model_free(e->head);
    free(e->d2t);
    free(e);
}
