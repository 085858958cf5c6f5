// The vocabulary in byte order: a sorted list with common-prefix lengths is a byte trie
// walked depth first, without trie nodes.
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"
#include "util/err.h"

typedef struct {
    const uint8_t *b;
    uint32_t len;
    int32_t id;
} sort_key;  // qsort has no context argument in C11: the keys carry their bytes

static int cmp_tokens(const void *pa, const void *pb) {
    const sort_key *a = pa, *b = pb;
    int c = memcmp(a->b, b->b, a->len < b->len ? a->len : b->len);
    if (c) return c;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

void kaon_grammar_vocab_free(kaon_grammar_vocab *v) {
    if (!v) return;
    gram_vocab_units_free(v);
    pthread_mutex_destroy(&v->units_lock);
    if (v->bytes && !v->packed)
        for (int i = 0; i < v->n; i++) free(v->bytes[i]);
    free(v->packed);
    free(v->bytes);
    free(v->lens);
    free(v->order);
    free(v->obytes);
    free(v->olens);
    free(v->by_len);
    free(v->len_at_least);
    free(v->lcp);
    free(v->eog);
    free(v->special);
    free(v->eog_ids);
    free(v);
}

// Moves the token bytes into one buffer in walk order (sorted tokens first), so a mask's
// walk reads them sequentially instead of from scattered allocations. Optional: on failure
// the tokens keep their own allocations.
static void pack_bytes(kaon_grammar_vocab *v) {
    size_t total = 0;
    for (int i = 0; i < v->n; i++) total += v->lens[i] + 1;
    uint8_t *buf = malloc(total), *p = buf;
    if (!buf) return;
    for (int k = 0; k < v->n_order; k++) {
        int32_t id = v->order[k];
        memcpy(p, v->bytes[id], v->lens[id] + 1);
        free(v->bytes[id]);
        v->bytes[id] = p;
        p += v->lens[id] + 1;
    }
    for (int i = 0; i < v->n; i++) {
        if (v->lens[i] && !v->special[i]) continue;  // in order: moved above
        memcpy(p, v->bytes[i], v->lens[i] + 1);
        free(v->bytes[i]);
        v->bytes[i] = p;
        p += v->lens[i] + 1;
    }
    v->packed = buf;
}

int kaon_grammar_vocab_size(const kaon_grammar_vocab *v) { return v ? v->n : 0; }

// by_len and len_at_least: a counting sort of the ranks by length, longest first (the masker
// takes the tokens long enough to reach a repetition's bound from its head).
static int sort_by_length(kaon_grammar_vocab *v) {
    for (int i = 0; i < v->n_order; i++)
        if ((int)v->olens[i] > v->max_len) v->max_len = (int)v->olens[i];
    v->by_len = malloc((size_t)(v->n_order + 1) * sizeof *v->by_len);
    v->len_at_least = calloc((size_t)v->max_len + 2, sizeof *v->len_at_least);
    int32_t *fill = malloc(((size_t)v->max_len + 2) * sizeof *fill);
    if (!v->by_len || !v->len_at_least || !fill) {
        free(fill);
        return -1;
    }
    for (int i = 0; i < v->n_order; i++) v->len_at_least[v->olens[i]]++;
    for (int l = v->max_len - 1; l >= 0; l--) v->len_at_least[l] += v->len_at_least[l + 1];
    for (int l = 0; l <= v->max_len; l++) fill[l] = v->len_at_least[l + 1];  // length l's slots
    for (int i = 0; i < v->n_order; i++) v->by_len[fill[v->olens[i]]++] = i;
    free(fill);
    return 0;
}

kaon_grammar_vocab *kaon_grammar_vocab_new(int n_tokens, const char *const *bytes, const size_t *lens,
                                           const bool *is_special, const int32_t *eog_ids, int n_eog) {
    if (n_tokens <= 0 || !bytes || !lens) {
        kaon_set_error("grammar vocab: no tokens");
        return NULL;
    }
    kaon_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) goto oom;
    pthread_mutex_init(&v->units_lock, NULL);
    v->n = n_tokens;
    v->bytes = calloc((size_t)n_tokens, sizeof *v->bytes);
    v->lens = calloc((size_t)n_tokens, sizeof *v->lens);
    v->order = malloc((size_t)n_tokens * sizeof *v->order);
    v->lcp = calloc((size_t)n_tokens, sizeof *v->lcp);
    v->eog = calloc((size_t)n_tokens, sizeof *v->eog);
    v->special = calloc((size_t)n_tokens, sizeof *v->special);
    v->eog_ids = malloc((size_t)(n_eog > 0 ? n_eog : 1) * sizeof *v->eog_ids);
    if (!v->bytes || !v->lens || !v->order || !v->lcp || !v->eog || !v->special || !v->eog_ids) goto oom;
    for (int i = 0; i < n_eog; i++) {
        if (eog_ids[i] < 0 || eog_ids[i] >= n_tokens || v->eog[eog_ids[i]]) continue;
        v->eog[eog_ids[i]] = true;
        v->eog_ids[v->n_eog++] = eog_ids[i];
    }
    for (int i = 0; i < n_tokens; i++) {
        size_t len = bytes[i] ? lens[i] : 0;
        if (len > UINT32_MAX / 2) len = 0;
        v->bytes[i] = malloc(len + 1);
        if (!v->bytes[i]) goto oom;
        if (len) memcpy(v->bytes[i], bytes[i], len);
        v->lens[i] = (uint32_t)len;
        // special and empty tokens are never text the grammar matches
        v->special[i] = (is_special && is_special[i]) || v->eog[i];
        if (len && !v->special[i]) v->order[v->n_order++] = i;
    }
    sort_key *keys = malloc((size_t)(v->n_order ? v->n_order : 1) * sizeof *keys);
    if (!keys) goto oom;
    for (int i = 0; i < v->n_order; i++) keys[i] = (sort_key){v->bytes[v->order[i]], v->lens[v->order[i]], v->order[i]};
    qsort(keys, (size_t)v->n_order, sizeof *keys, cmp_tokens);
    for (int i = 0; i < v->n_order; i++) v->order[i] = keys[i].id;
    free(keys);
    for (int b = 0, i = 0; b <= 256; b++) {
        while (i < v->n_order && v->bytes[v->order[i]][0] < b) i++;
        v->first_byte_start[b] = i;
    }
    for (int i = 1; i < v->n_order; i++) {
        int32_t a = v->order[i - 1], b = v->order[i];
        uint32_t n = v->lens[a] < v->lens[b] ? v->lens[a] : v->lens[b], k = 0;
        while (k < n && k < UINT16_MAX && v->bytes[a][k] == v->bytes[b][k]) k++;
        v->lcp[i] = (uint16_t)k;
    }
    pack_bytes(v);
    v->obytes = malloc((size_t)(v->n_order ? v->n_order : 1) * sizeof *v->obytes);
    v->olens = malloc((size_t)(v->n_order ? v->n_order : 1) * sizeof *v->olens);
    if (!v->obytes || !v->olens) goto oom;
    for (int i = 0; i < v->n_order; i++) {
        v->obytes[i] = v->bytes[v->order[i]];
        v->olens[i] = v->lens[v->order[i]];
    }
    if (sort_by_length(v)) goto oom;
    return v;
oom:
    kaon_set_error("grammar vocab: out of memory");
    kaon_grammar_vocab_free(v);
    return NULL;
}
