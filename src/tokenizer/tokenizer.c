// Vocabulary storage, the maps BPE needs, added-token tries, accessors and the decoders
// (one-shot and incremental). Encoding lives in encode.c, loaders in load.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/err.h"

// ---------------------------------------------------------------------------------------
// UTF-8 and the GPT-2 byte map

int tk_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    uint32_t v;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; v = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3; v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4; v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        unsigned b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return len;
}

// GPT-2 maps the 188 printable bytes to themselves and the 68 others, in order, to U+0100+.
static uint32_t byte_cp(uint8_t b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    if (b <= 32) return 256u + b;
    if (b >= 127 && b <= 160) return 289u + (b - 127u);
    return 323;  // 173
}

void tk_byte_to_char(uint8_t b, char out[3], int *len) {
    uint32_t cp = byte_cp(b);
    if (cp < 0x80) { out[0] = (char)cp; *len = 1; }
    else { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); *len = 2; }
}

int tk_char_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp >= 256 && cp <= 288) return (int)(cp - 256);
    if (cp >= 289 && cp <= 322) return (int)(cp - 289 + 127);
    if (cp == 323) return 173;
    return -1;
}

// ---------------------------------------------------------------------------------------
// Hashing and maps

static uint64_t tk_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ (v * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)s[i] << (8 * i);
    h = (h ^ (v * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    h ^= h >> 32;
    return h;
}

static int strmap_grow(tk_strmap *m) {
    uint32_t ncap = m->mask ? (m->mask + 1) * 2 : 1024;
    uint32_t *slots = calloc(ncap, sizeof *slots);
    if (!slots) return kaon_set_error("tokenizer: out of memory");
    for (uint32_t e = 0; e < m->n; e++) {
        uint32_t i = m->e_hash[e] & (ncap - 1);
        while (slots[i]) i = (i + 1) & (ncap - 1);
        slots[i] = e + 1;
    }
    free(m->slot_id);
    m->slot_id = slots;
    m->mask = ncap - 1;
    return 0;
}

int tk_strmap_get(const tk_strmap *m, const char *s, size_t len) {
    if (!m->mask) return -1;
    uint32_t h = (uint32_t)tk_hash(s, len);
    uint32_t i = h & m->mask;
    for (;;) {
        uint32_t e = m->slot_id[i];
        if (!e) return -1;
        e--;
        if (m->e_hash[e] == h && m->e_len[e] == len && !memcmp(m->arena + m->e_off[e], s, len))
            return m->e_val[e];
        i = (i + 1) & m->mask;
    }
}

int tk_strmap_put(tk_strmap *m, const char *s, size_t len, int32_t val) {
    if (len > TK_MAX_TOKEN_BYTES) return kaon_set_error("tokenizer: token text too long");
    if (tk_strmap_get(m, s, len) >= 0) return 0;
    if ((m->n + 1) * 2 > (m->mask ? m->mask + 1 : 0) && strmap_grow(m)) return -1;
    if (m->n == m->cap_entries) {
        uint32_t nc = m->cap_entries ? m->cap_entries * 2 : 1024;
        uint32_t *a = realloc(m->e_off, nc * sizeof *a);
        if (a) m->e_off = a;
        uint32_t *b = realloc(m->e_len, nc * sizeof *b);
        if (b) m->e_len = b;
        uint32_t *c = realloc(m->e_hash, nc * sizeof *c);
        if (c) m->e_hash = c;
        int32_t *d = realloc(m->e_val, nc * sizeof *d);
        if (d) m->e_val = d;
        if (!a || !b || !c || !d) return kaon_set_error("tokenizer: out of memory");
        m->cap_entries = nc;
    }
    if (m->arena_len + len + 1 > m->arena_cap) {
        size_t nc = m->arena_cap ? m->arena_cap * 2 : 65536;
        while (nc < m->arena_len + len + 1) nc *= 2;
        if (nc > UINT32_MAX) return kaon_set_error("tokenizer: vocabulary too large");
        char *a = realloc(m->arena, nc);
        if (!a) return kaon_set_error("tokenizer: out of memory");
        m->arena = a;
        m->arena_cap = nc;
    }
    memcpy(m->arena + m->arena_len, s, len);
    m->arena[m->arena_len + len] = 0;
    uint32_t e = m->n++;
    m->e_off[e] = (uint32_t)m->arena_len;
    m->e_len[e] = (uint32_t)len;
    m->e_hash[e] = (uint32_t)tk_hash(s, len);
    m->e_val[e] = val;
    m->arena_len += len + 1;
    uint32_t i = m->e_hash[e] & m->mask;
    while (m->slot_id[i]) i = (i + 1) & m->mask;
    m->slot_id[i] = e + 1;
    return 0;
}

void tk_strmap_free(tk_strmap *m) {
    free(m->slot_id);
    free(m->e_off);
    free(m->e_len);
    free(m->e_hash);
    free(m->e_val);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

static uint32_t pair_slot(uint64_t key, uint32_t mask) {
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static int pairmap_grow(tk_pairmap *p) {
    uint32_t ncap = p->mask ? (p->mask + 1) * 2 : 4096;
    uint64_t *k = malloc((size_t)ncap * sizeof *k);
    uint32_t *r = malloc((size_t)ncap * sizeof *r);
    int32_t *m = malloc((size_t)ncap * sizeof *m);
    if (!k || !r || !m) {
        free(k); free(r); free(m);
        return kaon_set_error("tokenizer: out of memory");
    }
    memset(k, 0xFF, (size_t)ncap * sizeof *k);
    if (p->mask) {
        for (uint32_t i = 0; i <= p->mask; i++) {
            if (p->keys[i] == UINT64_MAX) continue;
            uint32_t j = pair_slot(p->keys[i], ncap - 1);
            while (k[j] != UINT64_MAX) j = (j + 1) & (ncap - 1);
            k[j] = p->keys[i]; r[j] = p->rank[i]; m[j] = p->merged[i];
        }
    }
    free(p->keys); free(p->rank); free(p->merged);
    p->keys = k; p->rank = r; p->merged = m;
    p->mask = ncap - 1;
    return 0;
}

int tk_add_merge(kaon_tokenizer *t, int32_t l, int32_t r, uint32_t rank, int32_t merged) {
    tk_pairmap *p = &t->pairs;
    if ((p->n + 1) * 2 > (p->mask ? p->mask + 1 : 0) && pairmap_grow(p)) return -1;
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    uint32_t j = pair_slot(key, p->mask);
    while (p->keys[j] != UINT64_MAX) {
        if (p->keys[j] == key) return 0;  // first (lowest rank) wins, as HF
        j = (j + 1) & p->mask;
    }
    p->keys[j] = key; p->rank[j] = rank; p->merged[j] = merged;
    p->n++;
    return 0;
}

// ---------------------------------------------------------------------------------------
// Construction

kaon_tokenizer *tk_new(int kind) {
    kaon_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { kaon_set_error("tokenizer: out of memory"); return NULL; }
    t->kind = kind;
    t->unk_id = -1;
    t->bos = t->eos = -1;
    for (int i = 0; i < 256; i++) t->unit_tok[i] = t->byte_fb[i] = -1;
    for (int i = 0; i < 256; i++) t->trie_raw.root[i] = t->trie_norm.root[i] = -1;
    memcpy(t->meta_repl, "\xE2\x96\x81", 4);
    t->meta_repl_len = 3;
    return t;
}

int tk_set_vocab_size(kaon_tokenizer *t, int32_t n) {
    if (n < 0 || n > TK_MAX_VOCAB) return kaon_set_error("tokenizer: vocabulary size %d out of range", (int)n);
    if (n <= t->n_vocab) return 0;
    uint32_t *a = realloc(t->vform_off, (size_t)n * sizeof *a);
    if (a) t->vform_off = a;
    uint32_t *b = realloc(t->vform_len, (size_t)n * sizeof *b);
    if (b) t->vform_len = b;
    uint32_t *c = realloc(t->dec_off, (size_t)n * sizeof *c);
    if (c) t->dec_off = c;
    uint32_t *d = realloc(t->dec_len, (size_t)n * sizeof *d);
    if (d) t->dec_len = d;
    uint8_t *f = realloc(t->flags, (size_t)n);
    if (f) t->flags = f;
    if (!a || !b || !c || !d || !f) return kaon_set_error("tokenizer: out of memory");
    for (int32_t i = t->n_vocab; i < n; i++) {
        t->vform_off[i] = t->vform_len[i] = t->dec_off[i] = t->dec_len[i] = 0;
        t->flags[i] = 0;
    }
    t->n_vocab = n;
    return 0;
}

static int strs_append(kaon_tokenizer *t, const char *s, size_t len, uint32_t *off) {
    if (t->strs_len + len + 1 > t->strs_cap) {
        size_t nc = t->strs_cap ? t->strs_cap * 2 : 65536;
        while (nc < t->strs_len + len + 1) nc *= 2;
        if (nc > UINT32_MAX) return kaon_set_error("tokenizer: vocabulary text too large");
        char *p = realloc(t->strs, nc);
        if (!p) return kaon_set_error("tokenizer: out of memory");
        t->strs = p;
        t->strs_cap = nc;
    }
    *off = (uint32_t)t->strs_len;
    if (len) memcpy(t->strs + t->strs_len, s, len);
    t->strs[t->strs_len + len] = 0;
    t->strs_len += len + 1;
    return 0;
}

int tk_set_token(kaon_tokenizer *t, int32_t id, const char *s, size_t len, uint8_t flags) {
    if (id < 0 || id >= TK_MAX_VOCAB) return kaon_set_error("tokenizer: token id %d out of range", (int)id);
    if (len > TK_MAX_TOKEN_BYTES) return kaon_set_error("tokenizer: token %d longer than %d bytes", (int)id, TK_MAX_TOKEN_BYTES);
    if (id >= t->n_vocab && tk_set_vocab_size(t, id + 1)) return -1;
    if (t->flags[id] & TKF_PRESENT) {
        if (t->vform_len[id] != len || memcmp(t->strs + t->vform_off[id], s, len))
            return kaon_set_error("tokenizer: id %d given two different texts", (int)id);
        t->flags[id] |= flags;
        return 0;
    }
    uint32_t off;
    if (strs_append(t, s, len, &off)) return -1;
    t->vform_off[id] = off;
    t->vform_len[id] = (uint32_t)len;
    t->flags[id] |= (uint8_t)(flags | TKF_PRESENT);
    return 0;
}

const char *tk_vform(const kaon_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab || !(t->flags[id] & TKF_PRESENT)) return NULL;
    *len = t->vform_len[id];
    return t->strs + t->vform_off[id];
}

int tk_add_added(kaon_tokenizer *t, int32_t id, bool special, bool normalized, bool lstrip,
                 bool rstrip, bool single_word) {
    if (t->n_added >= TK_MAX_VOCAB) return kaon_set_error("tokenizer: too many added tokens");
    if ((t->n_added & (t->n_added - 1)) == 0) {
        size_t nc = t->n_added ? (size_t)t->n_added * 2 : 16;
        tk_added *a = realloc(t->added, nc * sizeof *a);
        if (!a) return kaon_set_error("tokenizer: out of memory");
        t->added = a;
    }
    tk_added *a = &t->added[t->n_added++];
    a->id = id;
    a->special = special;
    a->normalized = normalized;
    a->lstrip = lstrip;
    a->rstrip = rstrip;
    a->single_word = single_word;
    return 0;
}

static int trie_insert(tk_trie *tr, const unsigned char *s, size_t n, int32_t added) {
    if (n == 0) return 0;  // HF ignores empty added tokens
    int32_t *link = &tr->root[s[0]];
    int32_t node = -1;
    for (size_t i = 0; i < n; i++) {
        if (i > 0) link = &tr->nodes[node].child;
        int32_t c = *link;
        while (c >= 0 && tr->nodes[c].byte != s[i]) c = tr->nodes[c].sibling;
        if (c < 0) {
            if (tr->n == tr->cap) {
                int32_t nc = tr->cap ? tr->cap * 2 : 256;
                if (nc > (1 << 26)) return kaon_set_error("tokenizer: added tokens too large");
                tk_trie_node *p = realloc(tr->nodes, (size_t)nc * sizeof *p);
                if (!p) return kaon_set_error("tokenizer: out of memory");
                tr->nodes = p;
                tr->cap = nc;
                if (i > 0) link = &tr->nodes[node].child;  // nodes moved
            }
            c = tr->n++;
            tr->nodes[c].byte = s[i];
            tr->nodes[c].child = -1;
            tr->nodes[c].added = -1;
            tr->nodes[c].sibling = *link;
            *link = c;
        }
        node = c;
    }
    if (tr->nodes[node].added < 0) tr->nodes[node].added = added;  // first wins on duplicates
    return 0;
}

static const char *const eog_names[] = {
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|endoftext|>",
    "<end_of_turn>", "<|end|>", "</s>", "<|return|>", "<|END_OF_TURN_TOKEN|>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", NULL,
};

int tk_finish(kaon_tokenizer *t) {
    // Decoded forms and the maps.
    char *tmp = malloc(TK_MAX_TOKEN_BYTES * 2 + 8);
    if (!tmp) return kaon_set_error("tokenizer: out of memory");
    int rc = 0;
    for (int32_t id = 0; id < t->n_vocab && !rc; id++) {
        if (!(t->flags[id] & TKF_PRESENT)) continue;
        const char *v = t->strs + t->vform_off[id];
        size_t vl = t->vform_len[id];
        size_t dl = 0;
        bool mapped_all = true;
        if (t->dec_byte_level) {
            // HF ByteLevel decoder: chars through the byte map; a token with any unmapped
            // char is emitted as its own UTF-8.
            for (size_t i = 0; i < vl;) {
                uint32_t cp;
                int k = tk_utf8_decode((const unsigned char *)v + i, vl - i, &cp);
                int b = k ? tk_char_to_byte(cp) : -1;
                if (b < 0) { mapped_all = false; break; }
                tmp[dl++] = (char)b;
                i += (size_t)k;
            }
            if (!mapped_all) { memcpy(tmp, v, vl); dl = vl; }
        } else {
            int byte = -1;
            if (t->dec_byte_fb && vl == 6 && v[0] == '<' && v[1] == '0' && v[2] == 'x' && v[5] == '>') {
                unsigned x;
                char hex[3] = {v[3], v[4], 0};
                if (sscanf(hex, "%2X", &x) == 1 && strchr("0123456789ABCDEF", v[3]) && strchr("0123456789ABCDEF", v[4]))
                    byte = (int)x;
            }
            if (byte >= 0) {
                tmp[dl++] = (char)byte;
            } else {
                for (size_t i = 0; i < vl;) {
                    if (t->meta_repl_len && i + (size_t)t->meta_repl_len <= vl &&
                        !memcmp(v + i, t->meta_repl, (size_t)t->meta_repl_len)) {
                        tmp[dl++] = ' ';
                        i += (size_t)t->meta_repl_len;
                    } else {
                        tmp[dl++] = v[i++];
                    }
                }
            }
        }
        rc = strs_append(t, tmp, dl, &t->dec_off[id]);
        t->dec_len[id] = (uint32_t)dl;
        if (rc) break;
        v = t->strs + t->vform_off[id];  // strs may have moved
        rc = tk_strmap_put(&t->text_map, v, vl, id);
        if (rc || !(t->flags[id] & TKF_MODEL)) continue;
        if (t->kind == TK_BYTE_LEVEL) {
            // The BPE runs on raw bytes: key model tokens by their bytes (only tokens made of
            // mapped chars can come out of the byte-level BPE).
            if (mapped_all) rc = tk_strmap_put(&t->model_map, t->strs + t->dec_off[id], dl, id);
        } else {
            rc = tk_strmap_put(&t->model_map, v, vl, id);
        }
    }
    free(tmp);
    if (rc) return -1;

    for (int i = 0; i < 256; i++) {
        char c = (char)i;
        if (t->kind == TK_BYTE_LEVEL || i < 128) t->unit_tok[i] = tk_strmap_get(&t->model_map, &c, 1);
        if (t->byte_fallback) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", i);
            t->byte_fb[i] = tk_strmap_get(&t->model_map, name, 6);
        }
    }

    // Added tokens: flags and tries (normalized ones match their normalized form).
    for (int32_t i = 0; i < t->n_added; i++) {
        tk_added *a = &t->added[i];
        if (a->id < 0 || a->id >= t->n_vocab || !(t->flags[a->id] & TKF_PRESENT))
            return kaon_set_error("tokenizer: added token id %d has no text", (int)a->id);
        t->flags[a->id] |= TKF_ADDED | (a->special ? TKF_SPECIAL : 0);
        size_t n = 0;
        const char *s = tk_vform(t, a->id, &n);
        if (a->normalized && t->n_norm) {
            size_t nn;
            char *ns = tk_normalize_alloc(t, s, n, &nn);
            if (!ns) return kaon_set_error("tokenizer: out of memory");
            rc = trie_insert(&t->trie_norm, (const unsigned char *)ns, nn, i);
            free(ns);
            t->have_norm = true;
        } else if (a->normalized) {
            rc = trie_insert(&t->trie_norm, (const unsigned char *)s, n, i);
            t->have_norm = true;
        } else {
            rc = trie_insert(&t->trie_raw, (const unsigned char *)s, n, i);
            t->have_raw = true;
        }
        if (rc) return -1;
    }

    // End-of-generation tokens.
    if (t->eos >= 0 && t->eos < t->n_vocab) t->flags[t->eos] |= TKF_EOG;
    for (int i = 0; eog_names[i]; i++) {
        int id = tk_strmap_get(&t->text_map, eog_names[i], strlen(eog_names[i]));
        if (id >= 0 && (t->flags[id] & (TKF_SPECIAL | TKF_ADDED))) t->flags[id] |= TKF_EOG;
    }

    t->cache = calloc(1, sizeof *t->cache);
    if (!t->cache || pthread_mutex_init(&t->cache->mu, NULL)) {
        free(t->cache);
        t->cache = NULL;
        return kaon_set_error("tokenizer: out of memory");
    }
    return 0;
}

static void cache_free(tk_cache *c) {
    if (!c) return;
    pthread_mutex_destroy(&c->mu);
    free(c->hash); free(c->key_off); free(c->key_len); free(c->ids_off); free(c->ids_n);
    free(c->keys); free(c->ids);
    free(c);
}

void kaon_tokenizer_free(kaon_tokenizer *t) {
    if (!t) return;
    free(t->vform_off); free(t->vform_len); free(t->dec_off); free(t->dec_len);
    free(t->flags); free(t->strs);
    tk_strmap_free(&t->model_map);
    tk_strmap_free(&t->text_map);
    free(t->pairs.keys); free(t->pairs.rank); free(t->pairs.merged);
    free(t->added);
    free(t->trie_raw.nodes);
    free(t->trie_norm.nodes);
    for (int i = 0; i < t->n_norm; i++) { free(t->norm[i].a); free(t->norm[i].b); }
    tk_steps_free(t);
    free(t->chat_template);
    cache_free(t->cache);
    free(t);
}

// ---------------------------------------------------------------------------------------
// Accessors

int kaon_tokenizer_vocab_size(const kaon_tokenizer *t) { return t ? t->n_vocab : 0; }
int kaon_tokenizer_bos(const kaon_tokenizer *t) { return t ? t->bos : -1; }
int kaon_tokenizer_eos(const kaon_tokenizer *t) { return t ? t->eos : -1; }

bool kaon_tokenizer_is_special(const kaon_tokenizer *t, int id) {
    return t && id >= 0 && id < t->n_vocab && (t->flags[id] & TKF_SPECIAL);
}

bool kaon_tokenizer_is_eog(const kaon_tokenizer *t, int id) {
    return t && id >= 0 && id < t->n_vocab && (t->flags[id] & TKF_EOG);
}

const char *kaon_tokenizer_token_text(const kaon_tokenizer *t, int id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab || !(t->flags[id] & TKF_PRESENT)) return NULL;
    if (len) *len = t->dec_len[id];
    return t->strs + t->dec_off[id];
}

int kaon_tokenizer_find_token(const kaon_tokenizer *t, const char *text) {
    if (!t || !text) return -1;
    size_t n = strlen(text);
    int id = tk_strmap_get(&t->text_map, text, n);
    if (id < 0 && t->kind == TK_BYTE_LEVEL) id = tk_strmap_get(&t->model_map, text, n);
    return id;
}

const char *kaon_tokenizer_chat_template(const kaon_tokenizer *t) { return t ? t->chat_template : NULL; }

const char *kaon_tokenizer_bos_text(const kaon_tokenizer *t) {
    size_t n = 0;
    return t ? tk_vform(t, t->bos, &n) : NULL;
}

const char *kaon_tokenizer_eos_text(const kaon_tokenizer *t) {
    size_t n = 0;
    return t ? tk_vform(t, t->eos, &n) : NULL;
}

// ---------------------------------------------------------------------------------------
// Decoding. Each token becomes bytes (decoder rules below), the leading spaces the Strip
// decoder removes are dropped, and the byte stream is turned into UTF-8 replacing each
// maximal invalid subsequence by U+FFFD (Rust's from_utf8_lossy, which HF's ByteLevel
// decoder uses). HF's ByteFallback decoder instead turns every byte of an invalid run of
// <0xXX> tokens into U+FFFD; we use the lossy rule there too so that streaming can emit
// each character as soon as it is complete. Valid UTF-8 decodes identically.

typedef struct buf {
    char *p;
    size_t n, cap;
    bool oom;
} buf;

static void buf_put(buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 64;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = realloc(b->p, nc);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

// Length of the maximal prefix of s that could start a valid sequence (1..4), whether it
// is complete (*complete) or not.
static int utf8_prefix(const unsigned char *s, size_t n, bool *complete) {
    unsigned c = s[0];
    *complete = false;
    if (c < 0x80) { *complete = true; return 1; }
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 1;  // invalid lead: a subpart of one byte
    int k = 1;
    while (k < len && (size_t)k < n) {
        unsigned b = s[k];
        bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
        if (!ok) return k;
        k++;
    }
    if (k == len) *complete = true;
    return k;
}

// Converts s into out; returns how many bytes were consumed. When !final a trailing
// incomplete-but-valid-so-far sequence is left unconsumed.
static size_t utf8_lossy(buf *out, const unsigned char *s, size_t n, bool final) {
    size_t i = 0, run = 0;
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        bool complete;
        int k = utf8_prefix(s + i, n - i, &complete);
        if (complete) { i += (size_t)k; continue; }
        if (!final && i + (size_t)k == n && k < 4) {
            // Might still complete: stop here, but only if the prefix is a genuine start.
            unsigned c = s[i];
            if (c >= 0xC2 && c <= 0xF4) break;
        }
        buf_put(out, (const char *)s + run, i - run);
        buf_put(out, "\xEF\xBF\xBD", 3);
        i += (size_t)k;
        run = i;
    }
    buf_put(out, (const char *)s + run, i - run);
    return i;
}

struct kaon_detok {
    const kaon_tokenizer *t;
    bool skip;
    int64_t k;        // tokens passed to the decoder so far
    int strip_left;   // leading spaces still to drop
    unsigned char pend[4];
    int npend;
    char *tmp;        // scratch for the Metaspace first-token rule
};

static void detok_init(kaon_detok *d, const kaon_tokenizer *t, bool skip) {
    memset(d, 0, sizeof *d);
    d->t = t;
    d->skip = skip;
    d->strip_left = t->dec_strip;
}

static void detok_bytes(kaon_detok *d, buf *out, const char *s, size_t n, bool final) {
    while (n && d->strip_left > 0) {
        if (*s != ' ') { d->strip_left = 0; break; }
        s++; n--; d->strip_left--;
    }
    if (!n && !final) return;
    if (d->npend == 0) {
        size_t used = utf8_lossy(out, (const unsigned char *)s, n, final);
        size_t rest = n - used;  // an incomplete valid prefix: at most 3 bytes
        if (rest > sizeof d->pend) rest = sizeof d->pend;
        d->npend = (int)rest;
        memcpy(d->pend, s + used, rest);
        return;
    }
    // A character was split across tokens: convert pending + new bytes together.
    size_t np = (size_t)d->npend;
    if (np > sizeof d->pend) np = sizeof d->pend;
    size_t tn = np + n;
    unsigned char small[64];
    unsigned char *tmp = tn <= sizeof small ? small : malloc(tn);
    if (!tmp) { out->oom = true; return; }
    memcpy(tmp, d->pend, np);
    memcpy(tmp + np, s, n);
    size_t used = utf8_lossy(out, tmp, tn, final);
    size_t rest = tn - used;  // at most 3: an incomplete valid prefix
    if (rest > sizeof d->pend) rest = sizeof d->pend;
    d->npend = (int)rest;
    memcpy(d->pend, tmp + used, rest);
    if (tmp != small) free(tmp);
}

static void detok_token(kaon_detok *d, buf *out, int32_t id) {
    const kaon_tokenizer *t = d->t;
    if (id < 0 || id >= t->n_vocab || !(t->flags[id] & TKF_PRESENT)) return;  // HF skips
    if (d->skip && (t->flags[id] & TKF_SPECIAL)) return;
    if (t->dec_join_space && d->k > 0) detok_bytes(d, out, " ", 1, false);
    const char *s = t->strs + t->dec_off[id];
    size_t n = t->dec_len[id];
    if (t->dec_meta_first && d->k == 0) {
        // HF Metaspace decoder: the first token loses every replacement char.
        size_t vl = t->vform_len[id];
        const char *v = t->strs + t->vform_off[id];
        bool is_byte = t->dec_byte_fb && n == 1 && vl == 6 && v[0] == '<';
        if (!is_byte) {
            if (!d->tmp) d->tmp = malloc(TK_MAX_TOKEN_BYTES + 8);
            if (d->tmp) {
                size_t m = 0;
                for (size_t i = 0; i < vl;) {
                    if (i + (size_t)t->meta_repl_len <= vl && !memcmp(v + i, t->meta_repl, (size_t)t->meta_repl_len))
                        i += (size_t)t->meta_repl_len;
                    else
                        d->tmp[m++] = v[i++];
                }
                s = d->tmp;
                n = m;
            }
        }
    }
    d->k++;
    detok_bytes(d, out, s, n, false);
}

int kaon_detokenize(const kaon_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                    char **text, size_t *len) {
    if (!t || !text || (!ids && n)) return kaon_set_error("kaon_detokenize: bad arguments");
    kaon_detok d;
    detok_init(&d, t, skip_special);
    buf out = {0};
    buf_put(&out, "", 0);
    for (size_t i = 0; i < n; i++) detok_token(&d, &out, ids[i]);
    detok_bytes(&d, &out, "", 0, true);
    free(d.tmp);
    if (out.oom) { free(out.p); return kaon_set_error("kaon_detokenize: out of memory"); }
    *text = out.p;
    if (len) *len = out.n;
    return 0;
}

kaon_detok *kaon_detok_new(const kaon_tokenizer *t, bool skip_special) {
    if (!t) { kaon_set_error("kaon_detok_new: no tokenizer"); return NULL; }
    kaon_detok *d = malloc(sizeof *d);
    if (!d) { kaon_set_error("kaon_detok_new: out of memory"); return NULL; }
    detok_init(d, t, skip_special);
    return d;
}

static int detok_out(buf *out, char **s, size_t *len) {
    if (out->oom) { free(out->p); return kaon_set_error("kaon_detok: out of memory"); }
    *s = out->p;
    if (len) *len = out->n;
    return (int)(out->n > INT32_MAX ? INT32_MAX : out->n);
}

int kaon_detok_push(kaon_detok *d, int32_t id, char **out, size_t *len) {
    if (!d || !out) return kaon_set_error("kaon_detok_push: bad arguments");
    buf b = {0};
    buf_put(&b, "", 0);
    detok_token(d, &b, id);
    return detok_out(&b, out, len);
}

int kaon_detok_flush(kaon_detok *d, char **out, size_t *len) {
    if (!d || !out) return kaon_set_error("kaon_detok_flush: bad arguments");
    buf b = {0};
    buf_put(&b, "", 0);
    detok_bytes(d, &b, "", 0, true);
    return detok_out(&b, out, len);
}

void kaon_detok_free(kaon_detok *d) {
    if (!d) return;
    free(d->tmp);
    free(d);
}
