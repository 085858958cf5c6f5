// Loaders: GGUF metadata (tokenizer.ggml.*) and HF tokenizer.json (+ tokenizer_config.json).
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/err.h"

static const char META[] = "\xE2\x96\x81";  // "▁"

static int add_norm(kaon_tokenizer *t, int kind, const char *a, size_t al, const char *b, size_t bl) {
    if (t->n_norm >= TK_MAX_NORM_OPS) return kaon_set_error("tokenizer: too many normalizer steps");
    tk_normop *op = &t->norm[t->n_norm];
    op->kind = kind;
    op->a = malloc(al + 1);
    op->b = malloc(bl + 1);
    if (!op->a || !op->b) {
        free(op->a); free(op->b);
        op->a = op->b = NULL;
        return kaon_set_error("tokenizer: out of memory");
    }
    memcpy(op->a, a, al); op->a[al] = 0;
    if (bl) memcpy(op->b, b, bl);
    op->b[bl] = 0;
    op->a_len = al;
    op->b_len = bl;
    t->n_norm++;
    return 0;
}

// ---------------------------------------------------------------------------------------
// GGUF

enum { GT_NORMAL = 1, GT_UNKNOWN = 2, GT_CONTROL = 3, GT_USER = 4, GT_UNUSED = 5, GT_BYTE = 6 };

static bool read_num(enum kaon_gguf_type et, const void *data, uint64_t i, double *out) {
    const unsigned char *p = data;
    switch (et) {
    case KAON_GGUF_U8: *out = p[i]; return true;
    case KAON_GGUF_I8: *out = (int8_t)p[i]; return true;
    case KAON_GGUF_U16: { uint16_t v; memcpy(&v, p + 2 * i, 2); *out = v; return true; }
    case KAON_GGUF_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); *out = v; return true; }
    case KAON_GGUF_U32: { uint32_t v; memcpy(&v, p + 4 * i, 4); *out = v; return true; }
    case KAON_GGUF_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); *out = v; return true; }
    case KAON_GGUF_F32: { float v; memcpy(&v, p + 4 * i, 4); *out = v; return true; }
    case KAON_GGUF_U64: { uint64_t v; memcpy(&v, p + 8 * i, 8); *out = (double)v; return true; }
    case KAON_GGUF_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); *out = (double)v; return true; }
    case KAON_GGUF_F64: { double v; memcpy(&v, p + 8 * i, 8); *out = v; return true; }
    default: return false;
    }
}

typedef struct { float score; int32_t id; } score_ent;

static int cmp_score(const void *a, const void *b) {
    const score_ent *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

// SentencePiece vocabularies carry scores instead of merges: a pair may merge when the
// concatenation is a normal token, higher score first. That is the same as BPE merges
// ranked by the merged token's score, which is how we store it.
static int merges_from_scores(kaon_tokenizer *t, const uint8_t *types, const float *scores) {
    int32_t n = t->n_vocab;
    score_ent *ord = malloc((size_t)n * sizeof *ord);
    uint32_t *rank = malloc((size_t)n * sizeof *rank);
    if (!ord || !rank) { free(ord); free(rank); return kaon_set_error("tokenizer: out of memory"); }
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (types[i] != GT_NORMAL) continue;
        ord[m].score = isnan(scores[i]) ? -INFINITY : scores[i];
        ord[m].id = i;
        m++;
    }
    qsort(ord, (size_t)m, sizeof *ord, cmp_score);
    for (int32_t i = 0; i < m; i++) rank[ord[i].id] = (uint32_t)i;
    int rc = 0;
    for (int32_t k = 0; k < m && !rc; k++) {
        int32_t id = ord[k].id;
        size_t len = 0;
        const char *s = tk_vform(t, id, &len);
        if (!s) continue;
        for (size_t cut = 1; cut < len && !rc; cut++) {
            if (((unsigned char)s[cut] & 0xC0) == 0x80) continue;  // split at char boundaries
            int l = tk_strmap_get(&t->model_map, s, cut);
            int r = tk_strmap_get(&t->model_map, s + cut, len - cut);
            if (l >= 0 && r >= 0) rc = tk_add_merge(t, l, r, rank[id], id);
        }
    }
    free(ord);
    free(rank);
    return rc;
}

static int gguf_merges(kaon_tokenizer *t, const kaon_gguf *g) {
    enum kaon_gguf_type et;
    uint64_t n;
    if (!kaon_gguf_get_array(g, "tokenizer.ggml.merges", &et, &n) || et != KAON_GGUF_STRING)
        return kaon_set_error("tokenizer: GGUF gpt2 vocabulary without tokenizer.ggml.merges");
    if (n > (uint64_t)TK_MAX_VOCAB * 4) return kaon_set_error("tokenizer: too many merges");
    char *tmp = malloc(2 * TK_MAX_TOKEN_BYTES + 2);
    if (!tmp) return kaon_set_error("tokenizer: out of memory");
    int rc = 0;
    for (uint64_t i = 0; i < n && !rc; i++) {
        kaon_gguf_str s = kaon_gguf_array_str(g, "tokenizer.ggml.merges", i);
        if (!s.ptr || s.len > 2 * TK_MAX_TOKEN_BYTES) { rc = kaon_set_error("tokenizer: bad merge %llu", (unsigned long long)i); break; }
        const char *sp = memchr(s.ptr, ' ', s.len);
        if (!sp || sp == s.ptr) { rc = kaon_set_error("tokenizer: merge %llu is not 'a b'", (unsigned long long)i); break; }
        size_t al = (size_t)(sp - s.ptr), bl = s.len - al - 1;
        int a = tk_strmap_get(&t->text_map, s.ptr, al);
        int b = tk_strmap_get(&t->text_map, sp + 1, bl);
        memcpy(tmp, s.ptr, al);
        memcpy(tmp + al, sp + 1, bl);
        int m = tk_strmap_get(&t->text_map, tmp, al + bl);
        if (a < 0 || b < 0 || m < 0) {
            rc = kaon_set_error("tokenizer: merge %llu '%.*s' uses unknown tokens", (unsigned long long)i,
                                (int)(s.len > 64 ? 64 : s.len), s.ptr);
            break;
        }
        rc = tk_add_merge(t, a, b, (uint32_t)i, m);
    }
    free(tmp);
    return rc;
}

static void set_post(kaon_tokenizer *t, bool add_bos, bool add_eos) {
    t->n_post_pre = t->n_post_suf = 0;
    if (add_bos && t->bos >= 0) t->post_pre[t->n_post_pre++] = t->bos;
    if (add_eos && t->eos >= 0) t->post_suf[t->n_post_suf++] = t->eos;
}

kaon_tokenizer *kaon_tokenizer_from_gguf(const kaon_gguf *g) {
    if (!g) { kaon_set_error("tokenizer: no GGUF file"); return NULL; }
    kaon_gguf_str model;
    if (!kaon_gguf_get_str(g, "tokenizer.ggml.model", &model)) {
        kaon_set_error("tokenizer: GGUF file has no tokenizer.ggml.model");
        return NULL;
    }
    int kind;
    if (kaon_gguf_str_eq(model, "gpt2")) kind = TK_BYTE_LEVEL;
    else if (kaon_gguf_str_eq(model, "llama")) kind = TK_CHAR_LEVEL;
    else {
        kaon_set_error("tokenizer: unsupported GGUF tokenizer model '%.*s'", (int)(model.len > 64 ? 64 : model.len), model.ptr);
        return NULL;
    }
    enum kaon_gguf_type et;
    uint64_t n;
    if (!kaon_gguf_get_array(g, "tokenizer.ggml.tokens", &et, &n) || et != KAON_GGUF_STRING || n == 0) {
        kaon_set_error("tokenizer: GGUF file has no tokenizer.ggml.tokens");
        return NULL;
    }
    if (n > TK_MAX_VOCAB) { kaon_set_error("tokenizer: %llu tokens is too many", (unsigned long long)n); return NULL; }
    kaon_tokenizer *t = tk_new(kind);
    uint8_t *types = calloc(n, 1);
    float *scores = NULL;
    if (!t || !types) goto oom;
    t->dec_byte_level = kind == TK_BYTE_LEVEL;

    // Token types (1 normal when absent) and scores.
    enum kaon_gguf_type tt;
    uint64_t tn;
    const void *tdata = NULL;
    if (kaon_gguf_get_array(g, "tokenizer.ggml.token_type", &tt, &tn)) {
        if (tn != n) { kaon_set_error("tokenizer: token_type has %llu entries for %llu tokens", (unsigned long long)tn, (unsigned long long)n); goto fail; }
        tdata = kaon_gguf_array_data(g, "tokenizer.ggml.token_type");
    }
    for (uint64_t i = 0; i < n; i++) {
        double v = GT_NORMAL;
        if (tdata && !read_num(tt, tdata, i, &v)) { kaon_set_error("tokenizer: token_type is not numeric"); goto fail; }
        types[i] = (v >= 1 && v <= 6) ? (uint8_t)v : GT_NORMAL;
    }
    if (kind == TK_CHAR_LEVEL) {
        scores = malloc(n * sizeof *scores);
        if (!scores) goto oom;
        enum kaon_gguf_type st;
        uint64_t sn;
        const void *sdata = NULL;
        if (kaon_gguf_get_array(g, "tokenizer.ggml.scores", &st, &sn)) {
            if (sn != n) { kaon_set_error("tokenizer: scores has %llu entries for %llu tokens", (unsigned long long)sn, (unsigned long long)n); goto fail; }
            sdata = kaon_gguf_array_data(g, "tokenizer.ggml.scores");
        }
        for (uint64_t i = 0; i < n; i++) {
            double v = -(double)i;  // no scores: earlier ids win
            if (sdata && !read_num(st, sdata, i, &v)) { kaon_set_error("tokenizer: scores are not numeric"); goto fail; }
            scores[i] = (float)v;
        }
    }

    if (tk_set_vocab_size(t, (int32_t)n)) goto fail;
    for (uint64_t i = 0; i < n; i++) {
        kaon_gguf_str s = kaon_gguf_array_str(g, "tokenizer.ggml.tokens", i);
        if (!s.ptr && s.len) { kaon_set_error("tokenizer: bad token %llu", (unsigned long long)i); goto fail; }
        if (tk_set_token(t, (int32_t)i, s.ptr ? s.ptr : "", (size_t)s.len, TKF_MODEL)) goto fail;
        // Control and unknown tokens are special added tokens (as HF's tokenizer.json has
        // <unk>, <s>, </s>); user-defined ones are added tokens that decode normally.
        if ((types[i] == GT_CONTROL || types[i] == GT_UNKNOWN) &&
            tk_add_added(t, (int32_t)i, true, false, false, false, false))
            goto fail;
        if (types[i] == GT_USER && tk_add_added(t, (int32_t)i, false, false, false, false, false)) goto fail;
        if (types[i] == GT_UNKNOWN && t->unk_id < 0) t->unk_id = (int32_t)i;
    }

    kaon_gguf_str pre;
    bool add_space = kaon_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", true);
    if (kind == TK_BYTE_LEVEL) {
        char name[64] = "default";
        if (kaon_gguf_get_str(g, "tokenizer.ggml.pre", &pre)) {
            if (pre.len >= sizeof name || memchr(pre.ptr, 0, pre.len)) { kaon_set_error("tokenizer: unknown GGUF pre-tokenizer (tokenizer.ggml.pre too long)"); goto fail; }
            memcpy(name, pre.ptr, pre.len);
            name[pre.len] = 0;
        }
        if (tk_steps_for_gguf_pre(t, name)) goto fail;
        // Llama-3's tokenizer.json has ignore_merges (a whole pre-token in the vocab wins).
        t->ignore_merges = !strcmp(name, "llama-bpe") || !strcmp(name, "llama3") || !strcmp(name, "llama-v3");
    } else {
        // SentencePiece: "▁" for spaces, a prefix space, byte fallback, fused unknowns.
        if (add_space && add_norm(t, NORM_PREPEND, META, 3, "", 0)) goto fail;
        if (add_norm(t, NORM_REPLACE, " ", 1, META, 3)) goto fail;
        t->byte_fallback = true;
        t->dec_byte_fb = true;
        t->fuse_unk = true;
        t->dec_strip = add_space ? 1 : 0;
    }

    int64_t bos = kaon_gguf_get_int(g, "tokenizer.ggml.bos_token_id", -1);
    int64_t eos = kaon_gguf_get_int(g, "tokenizer.ggml.eos_token_id", -1);
    t->bos = bos >= 0 && (uint64_t)bos < n ? (int32_t)bos : -1;
    t->eos = eos >= 0 && (uint64_t)eos < n ? (int32_t)eos : -1;
    bool add_bos = kaon_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", kind == TK_CHAR_LEVEL);
    bool add_eos = kaon_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", false);
    set_post(t, add_bos, add_eos);

    kaon_gguf_str tmpl;
    if (kaon_gguf_get_str(g, "tokenizer.chat_template", &tmpl) && tmpl.ptr && tmpl.len < (1u << 26)) {
        t->chat_template = malloc(tmpl.len + 1);
        if (!t->chat_template) goto oom;
        memcpy(t->chat_template, tmpl.ptr, tmpl.len);
        t->chat_template[tmpl.len] = 0;
    }

    if (tk_finish(t)) goto fail;
    // Byte tokens are found by their <0xXX> text; the GGUF type 6 marks them too.
    const char *eog_keys[] = {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
    for (int i = 0; i < 2; i++) {
        int64_t id = kaon_gguf_get_int(g, eog_keys[i], -1);
        if (id >= 0 && id < t->n_vocab) t->flags[id] |= TKF_EOG;
    }
    if (kind == TK_BYTE_LEVEL) {
        if (gguf_merges(t, g)) goto fail;
    } else {
        if (merges_from_scores(t, types, scores)) goto fail;
    }
    free(types);
    free(scores);
    return t;
oom:
    kaon_set_error("tokenizer: out of memory");
fail:
    free(types);
    free(scores);
    kaon_tokenizer_free(t);
    return NULL;
}

// ---------------------------------------------------------------------------------------
// HF tokenizer.json

static const cJSON *jget(const cJSON *o, const char *k) {
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
}

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = jget(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool jbool(const cJSON *o, const char *k, bool dflt) {
    const cJSON *v = jget(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static bool jint(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d < (double)TK_MAX_VOCAB) || d != floor(d)) return false;
    *out = (int64_t)d;
    return true;
}

// A token given as "text" or {"content": "text"} (tokenizer_config.json).
static const char *jtoken(const cJSON *o, const char *k) {
    const cJSON *v = jget(o, k);
    if (cJSON_IsString(v)) return v->valuestring;
    return jstr(v, "content");
}

static int parse_norm(kaon_tokenizer *t, const cJSON *n, int depth) {
    if (!n || cJSON_IsNull(n)) return 0;
    if (depth > 4) return kaon_set_error("tokenizer: normalizer nested too deep");
    const char *type = jstr(n, "type");
    if (!type) return kaon_set_error("tokenizer: normalizer without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(n, "normalizers"), *e;
        if (!cJSON_IsArray(list)) return kaon_set_error("tokenizer: Sequence normalizer without a list");
        cJSON_ArrayForEach(e, list) if (parse_norm(t, e, depth + 1)) return -1;
        return 0;
    }
    if (!strcmp(type, "Prepend")) {
        const char *p = jstr(n, "prepend");
        if (!p) return kaon_set_error("tokenizer: Prepend normalizer without text");
        return add_norm(t, NORM_PREPEND, p, strlen(p), "", 0);
    }
    if (!strcmp(type, "Replace")) {
        const char *pat = jstr(jget(n, "pattern"), "String");
        const char *content = jstr(n, "content");
        if (!pat || !content) return kaon_set_error("tokenizer: Replace normalizer supports only a String pattern");
        return add_norm(t, NORM_REPLACE, pat, strlen(pat), content, strlen(content));
    }
    if (!strcmp(type, "NFC")) {
        // Approximation: NFC is treated as the identity, exact for text that is already in
        // NFC (nearly all text). Documented limitation.
        return 0;
    }
    return kaon_set_error("tokenizer: unsupported normalizer '%s'", type);
}

static int behavior_of(const char *b) {
    if (!b || !strcmp(b, "Isolated")) return SPLIT_ISOLATED;
    if (!strcmp(b, "Removed")) return SPLIT_REMOVED;
    if (!strcmp(b, "MergedWithPrevious")) return SPLIT_MERGED_PREV;
    if (!strcmp(b, "MergedWithNext")) return SPLIT_MERGED_NEXT;
    if (!strcmp(b, "Contiguous")) return SPLIT_CONTIGUOUS;
    return -1;
}

static int prepend_of(const cJSON *o) {
    const char *s = jstr(o, "prepend_scheme");
    if (s) {
        if (!strcmp(s, "always")) return PREPEND_ALWAYS;
        if (!strcmp(s, "first")) return PREPEND_FIRST;
        if (!strcmp(s, "never")) return PREPEND_NEVER;
        return -1;
    }
    return jbool(o, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
}

static int parse_pretok(kaon_tokenizer *t, const cJSON *p, int depth, bool *byte_level) {
    if (!p || cJSON_IsNull(p)) return 0;
    if (depth > 4) return kaon_set_error("tokenizer: pre-tokenizer nested too deep");
    const char *type = jstr(p, "type");
    if (!type) return kaon_set_error("tokenizer: pre-tokenizer without a type");
    if (*byte_level) return kaon_set_error("tokenizer: pre-tokenizer '%s' after ByteLevel is not supported", type);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(p, "pretokenizers"), *e;
        if (!cJSON_IsArray(list)) return kaon_set_error("tokenizer: Sequence pre-tokenizer without a list");
        cJSON_ArrayForEach(e, list) if (parse_pretok(t, e, depth + 1, byte_level)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        *byte_level = true;
        if (jbool(p, "add_prefix_space", false)) {
            if (t->n_steps >= TK_MAX_STEPS) return kaon_set_error("tokenizer: too many pre-tokenizer steps");
            tk_step *s = &t->steps[t->n_steps++];
            memset(s, 0, sizeof *s);
            s->kind = STEP_PREFIX_SPACE;
        }
        if (jbool(p, "use_regex", true)) return tk_steps_for_gguf_pre(t, "gpt2");
        return 0;
    }
    if (!strcmp(type, "Split")) {
        const cJSON *pat = jget(p, "pattern");
        int beh = behavior_of(jstr(p, "behavior"));
        bool inv = jbool(p, "invert", false);
        if (beh < 0) return kaon_set_error("tokenizer: unknown Split behavior '%s'", jstr(p, "behavior"));
        const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String");
        if (re) return tk_add_split_step(t, re, strlen(re), beh, inv);
        if (lit) return tk_add_literal_split_step(t, lit, strlen(lit), beh, inv);
        return kaon_set_error("tokenizer: Split pre-tokenizer without a Regex or String pattern");
    }
    if (!strcmp(type, "Digits")) {
        const char *re = jbool(p, "individual_digits", false) ? "\\p{N}" : "\\p{N}+";
        return tk_add_split_step(t, re, strlen(re), SPLIT_ISOLATED, false);
    }
    if (!strcmp(type, "Whitespace")) {
        static const char ws[] = "\\w+|[^\\w\\s]+";  // HF: keep words and punctuation runs
        return tk_add_split_step(t, ws, strlen(ws), SPLIT_REMOVED, true);
    }
    if (!strcmp(type, "WhitespaceSplit")) return tk_add_split_step(t, "\\s", 2, SPLIT_REMOVED, false);
    if (!strcmp(type, "Metaspace")) {
        if (t->n_steps >= TK_MAX_STEPS) return kaon_set_error("tokenizer: too many pre-tokenizer steps");
        const char *r = jstr(p, "replacement");
        if (!r) r = META;
        size_t rl = strlen(r);
        int pp = prepend_of(p);
        if (rl == 0 || rl > 4 || pp < 0) return kaon_set_error("tokenizer: bad Metaspace pre-tokenizer");
        tk_step *s = &t->steps[t->n_steps++];
        memset(s, 0, sizeof *s);
        s->kind = STEP_METASPACE;
        memcpy(s->repl, r, rl);
        s->repl_len = (int)rl;
        s->prepend = pp;
        s->split = jbool(p, "split", true);
        return 0;
    }
    return kaon_set_error("tokenizer: unsupported pre-tokenizer '%s'", type);
}

typedef struct dec_state { bool fused, has_meta, byte_fb; } dec_state;

static int parse_decoder(kaon_tokenizer *t, const cJSON *d, int depth, dec_state *st) {
    if (!d || cJSON_IsNull(d)) { t->dec_join_space = depth == 0; return 0; }
    if (depth > 4) return kaon_set_error("tokenizer: decoder nested too deep");
    const char *type = jstr(d, "type");
    if (!type) return kaon_set_error("tokenizer: decoder without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(d, "decoders"), *e;
        if (!cJSON_IsArray(list)) return kaon_set_error("tokenizer: Sequence decoder without a list");
        cJSON_ArrayForEach(e, list) if (parse_decoder(t, e, depth + 1, st)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) { t->dec_byte_level = true; return 0; }
    if (!strcmp(type, "ByteFallback")) { st->byte_fb = true; return 0; }
    if (!strcmp(type, "Fuse")) { st->fused = true; return 0; }
    if (!strcmp(type, "Replace")) {
        const char *pat = jstr(jget(d, "pattern"), "String");
        const char *content = jstr(d, "content");
        if (!pat || !content || strcmp(content, " ") || strlen(pat) == 0 || strlen(pat) > 4)
            return kaon_set_error("tokenizer: only Replace(\"<char>\", \" \") decoders are supported");
        memcpy(t->meta_repl, pat, strlen(pat) + 1);
        t->meta_repl_len = (int)strlen(pat);
        st->has_meta = true;
        return 0;
    }
    if (!strcmp(type, "Strip")) {
        const char *c = jstr(d, "content");
        const cJSON *start = jget(d, "start"), *stop = jget(d, "stop");
        int64_t a = 0, b = 0;
        if (!c || strcmp(c, " ") || !jint(start, &a) || (stop && !jint(stop, &b)) || b != 0 || !st->fused || a > 64)
            return kaon_set_error("tokenizer: only Strip(\" \", n, 0) after Fuse is supported");
        t->dec_strip = (int)a;
        return 0;
    }
    if (!strcmp(type, "Metaspace")) {
        const char *r = jstr(d, "replacement");
        if (!r) r = META;
        int pp = prepend_of(d);
        if (strlen(r) == 0 || strlen(r) > 4 || pp < 0) return kaon_set_error("tokenizer: bad Metaspace decoder");
        memcpy(t->meta_repl, r, strlen(r) + 1);
        t->meta_repl_len = (int)strlen(r);
        t->dec_meta_first = pp != PREPEND_NEVER;
        st->has_meta = true;
        return 0;
    }
    return kaon_set_error("tokenizer: unsupported decoder '%s'", type);
}

static int post_token(kaon_tokenizer *t, int32_t id, bool prefix) {
    int32_t *arr = prefix ? t->post_pre : t->post_suf;
    int *n = prefix ? &t->n_post_pre : &t->n_post_suf;
    if (*n >= TK_MAX_POST) return kaon_set_error("tokenizer: post-processor adds too many tokens");
    if (id < 0 || id >= TK_MAX_VOCAB) return kaon_set_error("tokenizer: post-processor token id out of range");
    arr[(*n)++] = id;
    return 0;
}

static int parse_post(kaon_tokenizer *t, const cJSON *p, int depth) {
    if (!p || cJSON_IsNull(p)) return 0;
    if (depth > 4) return kaon_set_error("tokenizer: post-processor nested too deep");
    const char *type = jstr(p, "type");
    if (!type) return kaon_set_error("tokenizer: post-processor without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(p, "processors"), *e;
        if (!cJSON_IsArray(list)) return kaon_set_error("tokenizer: Sequence post-processor without a list");
        cJSON_ArrayForEach(e, list) if (parse_post(t, e, depth + 1)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0;
    if (!strcmp(type, "TemplateProcessing")) {
        const cJSON *single = jget(p, "single"), *sp = jget(p, "special_tokens"), *e;
        if (!cJSON_IsArray(single)) return kaon_set_error("tokenizer: TemplateProcessing without 'single'");
        bool seen_seq = false;
        cJSON_ArrayForEach(e, single) {
            if (jget(e, "Sequence")) { seen_seq = true; continue; }
            const char *name = jstr(jget(e, "SpecialToken"), "id");
            if (!name) return kaon_set_error("tokenizer: bad TemplateProcessing item");
            const cJSON *ids = jget(jget(sp, name), "ids"), *x;
            if (!cJSON_IsArray(ids)) return kaon_set_error("tokenizer: TemplateProcessing token '%s' has no ids", name);
            cJSON_ArrayForEach(x, ids) {
                int64_t id;
                if (!jint(x, &id)) return kaon_set_error("tokenizer: bad TemplateProcessing id");
                if (post_token(t, (int32_t)id, !seen_seq)) return -1;
            }
        }
        return 0;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        const cJSON *cls = jget(p, "cls"), *sep = jget(p, "sep");
        int64_t a, b;
        if (!cJSON_IsArray(cls) || !cJSON_IsArray(sep) || !jint(cJSON_GetArrayItem(cls, 1), &a) ||
            !jint(cJSON_GetArrayItem(sep, 1), &b))
            return kaon_set_error("tokenizer: bad %s post-processor", type);
        if (post_token(t, (int32_t)a, true) || post_token(t, (int32_t)b, false)) return -1;
        return 0;
    }
    return kaon_set_error("tokenizer: unsupported post-processor '%s'", type);
}

static int parse_merges(kaon_tokenizer *t, const cJSON *merges) {
    if (!merges || cJSON_IsNull(merges)) return 0;
    if (!cJSON_IsArray(merges)) return kaon_set_error("tokenizer: model.merges is not a list");
    char *tmp = malloc(2 * TK_MAX_TOKEN_BYTES + 2);
    if (!tmp) return kaon_set_error("tokenizer: out of memory");
    uint32_t rank = 0;
    const cJSON *e;
    int rc = 0;
    cJSON_ArrayForEach(e, merges) {
        const char *a, *b;
        size_t al, bl;
        if (cJSON_IsString(e)) {
            a = e->valuestring;
            const char *sp = strchr(a, ' ');
            if (!sp) { rc = kaon_set_error("tokenizer: merge %u is not 'a b'", rank); break; }
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            a = cJSON_GetArrayItem(e, 0)->valuestring;
            b = cJSON_GetArrayItem(e, 1)->valuestring;
            al = strlen(a);
            bl = strlen(b);
        } else {
            rc = kaon_set_error("tokenizer: merge %u is neither 'a b' nor [a, b]", rank);
            break;
        }
        if (al > TK_MAX_TOKEN_BYTES || bl > TK_MAX_TOKEN_BYTES) { rc = kaon_set_error("tokenizer: merge %u too long", rank); break; }
        int ia = tk_strmap_get(&t->text_map, a, al), ib = tk_strmap_get(&t->text_map, b, bl);
        memcpy(tmp, a, al);
        memcpy(tmp + al, b, bl);
        int im = tk_strmap_get(&t->text_map, tmp, al + bl);
        if (ia < 0 || ib < 0 || im < 0) { rc = kaon_set_error("tokenizer: merge %u uses a token missing from the vocab", rank); break; }
        if ((rc = tk_add_merge(t, ia, ib, rank, im))) break;
        rank++;
    }
    free(tmp);
    return rc;
}

// True when the pre-tokenizer or the decoder is byte-level.
static bool has_type(const cJSON *o, const char *list_key, const char *type, int depth) {
    if (!o || depth > 4) return false;
    const char *ty = jstr(o, "type");
    if (ty && !strcmp(ty, type)) return true;
    const cJSON *list = jget(o, list_key), *e;
    if (cJSON_IsArray(list)) cJSON_ArrayForEach(e, list) if (has_type(e, list_key, type, depth + 1)) return true;
    return false;
}

static int find_text(const kaon_tokenizer *t, const char *s) {
    return s ? tk_strmap_get(&t->text_map, s, strlen(s)) : -1;
}

kaon_tokenizer *kaon_tokenizer_from_hf_json(const char *tokenizer_json, size_t len,
                                            const char *config_json, size_t config_len) {
    if (!tokenizer_json) { kaon_set_error("tokenizer: no tokenizer.json text"); return NULL; }
    cJSON *root = cJSON_ParseWithLength(tokenizer_json, len);
    cJSON *cfg = config_json ? cJSON_ParseWithLength(config_json, config_len) : NULL;
    kaon_tokenizer *t = NULL;
    char *buf = NULL;
    if (!cJSON_IsObject(root)) { kaon_set_error("tokenizer: tokenizer.json is not a JSON object"); goto fail; }
    if (config_json && !cJSON_IsObject(cfg)) { kaon_set_error("tokenizer: tokenizer_config.json is not a JSON object"); goto fail; }
    const cJSON *model = jget(root, "model");
    if (!cJSON_IsObject(model)) { kaon_set_error("tokenizer: tokenizer.json has no model"); goto fail; }
    const char *mtype = jstr(model, "type");
    if (mtype && strcmp(mtype, "BPE")) { kaon_set_error("tokenizer: unsupported model type '%s'", mtype); goto fail; }
    if (!mtype && !jget(model, "merges")) { kaon_set_error("tokenizer: model has no type and no merges"); goto fail; }
    const cJSON *drop = jget(model, "dropout");
    if (cJSON_IsNumber(drop) && drop->valuedouble > 0) { kaon_set_error("tokenizer: BPE dropout is not supported"); goto fail; }
    const char *csp = jstr(model, "continuing_subword_prefix"), *eow = jstr(model, "end_of_word_suffix");
    if ((csp && *csp) || (eow && *eow)) { kaon_set_error("tokenizer: continuing_subword_prefix/end_of_word_suffix are not supported"); goto fail; }

    bool byte_level = has_type(jget(root, "pre_tokenizer"), "pretokenizers", "ByteLevel", 0) ||
                      has_type(jget(root, "decoder"), "decoders", "ByteLevel", 0);
    t = tk_new(byte_level ? TK_BYTE_LEVEL : TK_CHAR_LEVEL);
    if (!t) goto fail;
    t->meta_repl_len = 0;  // set by a Replace/Metaspace decoder
    t->byte_fallback = jbool(model, "byte_fallback", false);
    t->fuse_unk = jbool(model, "fuse_unk", false);
    t->ignore_merges = jbool(model, "ignore_merges", false);

    // Vocabulary: {"text": id, ...}.
    const cJSON *vocab = jget(model, "vocab"), *e;
    if (!cJSON_IsObject(vocab)) { kaon_set_error("tokenizer: model.vocab is not an object"); goto fail; }
    int64_t max_id = -1, count = 0;
    cJSON_ArrayForEach(e, vocab) {
        int64_t id;
        if (!e->string || !jint(e, &id)) { kaon_set_error("tokenizer: bad vocab entry"); goto fail; }
        if (id > max_id) max_id = id;
        count++;
    }
    const cJSON *added = jget(root, "added_tokens");
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added)) { kaon_set_error("tokenizer: added_tokens is not a list"); goto fail; }
    cJSON_ArrayForEach(e, added) {
        int64_t id;
        if (!jint(jget(e, "id"), &id) || !jstr(e, "content")) { kaon_set_error("tokenizer: bad added token"); goto fail; }
        if (id > max_id) max_id = id;
        count++;
    }
    // Ids must be roughly dense: a hostile file must not make us allocate for 4M ids.
    if (max_id >= 2 * count + 65536) { kaon_set_error("tokenizer: token ids are too sparse (max id %lld)", (long long)max_id); goto fail; }
    if (tk_set_vocab_size(t, (int32_t)(max_id + 1))) goto fail;
    cJSON_ArrayForEach(e, vocab) {
        int64_t id = 0;
        jint(e, &id);
        if (tk_set_token(t, (int32_t)id, e->string, strlen(e->string), TKF_MODEL)) goto fail;
    }
    cJSON_ArrayForEach(e, added) {
        int64_t id = 0;
        jint(jget(e, "id"), &id);
        const char *c = jstr(e, "content");
        if (tk_set_token(t, (int32_t)id, c, strlen(c), 0)) goto fail;
        if (tk_add_added(t, (int32_t)id, jbool(e, "special", false), jbool(e, "normalized", true),
                         jbool(e, "lstrip", false), jbool(e, "rstrip", false), jbool(e, "single_word", false)))
            goto fail;
    }
    const char *unk = jstr(model, "unk_token");
    if (parse_norm(t, jget(root, "normalizer"), 0)) goto fail;
    bool bl = false;
    if (parse_pretok(t, jget(root, "pre_tokenizer"), 0, &bl)) goto fail;
    dec_state ds = {0};
    if (parse_decoder(t, jget(root, "decoder"), 0, &ds)) goto fail;
    t->dec_byte_level = byte_level;
    t->dec_byte_fb = ds.byte_fb;
    if (parse_post(t, jget(root, "post_processor"), 0)) goto fail;
    if (tk_finish(t)) goto fail;
    if (unk) {
        int id = tk_strmap_get(&t->model_map, unk, strlen(unk));
        if (id < 0) id = find_text(t, unk);
        t->unk_id = id;
    }
    if (parse_merges(t, jget(model, "merges"))) goto fail;

    // BOS/EOS and which of them encode adds: tokenizer_config.json wins when it says.
    t->bos = find_text(t, jtoken(cfg, "bos_token"));
    t->eos = find_text(t, jtoken(cfg, "eos_token"));
    if (t->bos < 0 && t->n_post_pre > 0) t->bos = t->post_pre[0];
    if (t->eos < 0 && !jtoken(cfg, "eos_token")) {
        static const char *names[] = {"</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", NULL};
        for (int i = 0; names[i] && t->eos < 0; i++) {
            int id = find_text(t, names[i]);
            if (id >= 0 && (t->flags[id] & TKF_SPECIAL)) t->eos = id;
        }
    }
    for (int i = 0; i < t->n_post_pre; i++)
        if (t->post_pre[i] >= t->n_vocab) { kaon_set_error("tokenizer: post-processor id out of range"); goto fail; }
    for (int i = 0; i < t->n_post_suf; i++)
        if (t->post_suf[i] >= t->n_vocab) { kaon_set_error("tokenizer: post-processor id out of range"); goto fail; }
    const cJSON *ab = jget(cfg, "add_bos_token"), *ae = jget(cfg, "add_eos_token");
    if (cJSON_IsBool(ab) || cJSON_IsBool(ae)) {
        bool want_bos = cJSON_IsBool(ab) ? cJSON_IsTrue(ab) : t->n_post_pre > 0;
        bool want_eos = cJSON_IsBool(ae) ? cJSON_IsTrue(ae) : t->n_post_suf > 0;
        set_post(t, want_bos, want_eos);
    }
    if (t->eos >= 0) t->flags[t->eos] |= TKF_EOG;

    const cJSON *tmpl = jget(cfg, "chat_template");
    const char *ts = NULL;
    if (cJSON_IsString(tmpl)) ts = tmpl->valuestring;
    else if (cJSON_IsArray(tmpl)) {
        cJSON_ArrayForEach(e, tmpl) {
            const char *name = jstr(e, "name");
            if (name && !strcmp(name, "default")) ts = jstr(e, "template");
        }
    }
    if (ts) {
        t->chat_template = strdup(ts);
        if (!t->chat_template) { kaon_set_error("tokenizer: out of memory"); goto fail; }
    }
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    return t;
fail:
    free(buf);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    kaon_tokenizer_free(t);
    return NULL;
}

static char *read_file(const char *path, size_t *len, bool must) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (must) kaon_set_error("tokenizer: cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    char *p = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            size_t nc = cap ? cap * 2 : 1 << 20;
            if (nc > (512u << 20)) { kaon_set_error("tokenizer: %s is too large", path); free(p); p = NULL; break; }
            char *q = realloc(p, nc);
            if (!q) { kaon_set_error("tokenizer: out of memory"); free(p); p = NULL; break; }
            p = q;
            cap = nc;
        }
        size_t r = fread(p + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    if (p && ferror(f)) { kaon_set_error("tokenizer: cannot read %s", path); free(p); p = NULL; }
    fclose(f);
    if (p) { p[n] = 0; *len = n; }
    return p;
}

kaon_tokenizer *kaon_tokenizer_from_hf_dir(const char *dir) {
    if (!dir) { kaon_set_error("tokenizer: no folder given"); return NULL; }
    size_t dl = strlen(dir);
    char *path = malloc(dl + 32);
    if (!path) { kaon_set_error("tokenizer: out of memory"); return NULL; }
    size_t tl = 0, cl = 0, jl = 0;
    snprintf(path, dl + 32, "%s/tokenizer.json", dir);
    char *tj = read_file(path, &tl, true);
    if (!tj) { free(path); return NULL; }
    snprintf(path, dl + 32, "%s/tokenizer_config.json", dir);
    char *cj = read_file(path, &cl, false);
    snprintf(path, dl + 32, "%s/chat_template.jinja", dir);
    char *jinja = read_file(path, &jl, false);
    free(path);
    kaon_tokenizer *t = kaon_tokenizer_from_hf_json(tj, tl, cj, cl);
    if (t && !t->chat_template && jinja) { t->chat_template = jinja; jinja = NULL; }
    free(tj);
    free(cj);
    free(jinja);
    return t;
}
