#include "engine/kv_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct block {
    int32_t ref;
    int32_t prev, next;  // free-list links (-1 at the ends); valid while ref == 0
    bool hashed;
    uint64_t hash, parent;
} block;

struct kaon_kv_pool {
    int n_blocks, block_size;
    block *b;
    int32_t *tokens;     // [n_blocks, block_size] contents of hashed blocks
    int32_t *table;      // open addressing: hash -> block, -1 empty, -2 deleted
    uint32_t table_mask;
    uint32_t n_tombstones;  // deleted slots; the table is rebuilt when they pile up
    int n_free;
    // The engine thread is the only writer; the lock is for readers on other threads (the
    // server's replica routing asks what is cached: kaon_kv_count_cached). A leaf lock.
    pthread_mutex_t mu;
    // Data-parallel parts (kaon_kv_pool_create_parts): part r owns blocks [first[r], first[r + 1])
    // and keeps its own LRU free list, so a rank's sequences take blocks of its cache only.
    int n_parts;
    int *first;                   // [n_parts + 1]
    int *free_head, *free_tail;   // [n_parts]
    int *n_free_in;               // [n_parts]
};

static int part_of(const kaon_kv_pool *p, int i) {
    int r = 0;
    while (r + 1 < p->n_parts && i >= p->first[r + 1]) r++;
    return r;
}

static void list_push_tail(kaon_kv_pool *p, int i) {
    const int r = part_of(p, i);
    p->b[i].prev = p->free_tail[r];
    p->b[i].next = -1;
    if (p->free_tail[r] >= 0) p->b[p->free_tail[r]].next = i;
    else p->free_head[r] = i;
    p->free_tail[r] = i;
    p->n_free++;
    p->n_free_in[r]++;
}

static void list_remove(kaon_kv_pool *p, int i) {
    const int r = part_of(p, i);
    block *x = &p->b[i];
    if (x->prev >= 0) p->b[x->prev].next = x->next;
    else p->free_head[r] = x->next;
    if (x->next >= 0) p->b[x->next].prev = x->prev;
    else p->free_tail[r] = x->prev;
    x->prev = x->next = -1;
    p->n_free--;
    p->n_free_in[r]--;
}

kaon_kv_pool *kaon_kv_pool_create(int n_blocks, int block_size) {
    return kaon_kv_pool_create_parts(n_blocks, block_size, 1);
}

kaon_kv_pool *kaon_kv_pool_create_parts(int n_blocks, int block_size, int n_parts) {
    if (n_blocks < 1 || block_size < 1 || n_parts < 1 || n_parts > n_blocks) return NULL;
    kaon_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->n_parts = n_parts;
    p->first = malloc(sizeof(int) * (size_t)(n_parts + 1));
    p->free_head = malloc(sizeof(int) * (size_t)n_parts);
    p->free_tail = malloc(sizeof(int) * (size_t)n_parts);
    p->n_free_in = calloc((size_t)n_parts, sizeof(int));
    if (!p->first || !p->free_head || !p->free_tail || !p->n_free_in) {
        kaon_kv_pool_free(p);
        return NULL;
    }
    for (int r = 0; r <= n_parts; r++) p->first[r] = (int)((int64_t)r * n_blocks / n_parts);
    for (int r = 0; r < n_parts; r++) p->free_head[r] = p->free_tail[r] = -1;
    uint32_t cap = 16;
    while (cap < (uint32_t)n_blocks * 2) cap <<= 1;
    p->table_mask = cap - 1;
    p->b = calloc((size_t)n_blocks, sizeof *p->b);
    p->tokens = malloc(sizeof(int32_t) * (size_t)n_blocks * block_size);
    p->table = malloc(sizeof(int32_t) * cap);
    if (!p->b || !p->tokens || !p->table) {
        kaon_kv_pool_free(p);
        return NULL;
    }
    memset(p->table, 0xff, sizeof(int32_t) * cap);  // -1
    for (int i = 0; i < n_blocks; i++) list_push_tail(p, i);
    return p;
}

void kaon_kv_pool_free(kaon_kv_pool *p) {
    if (!p) return;
    free(p->b);
    free(p->tokens);
    free(p->table);
    pthread_mutex_destroy(&p->mu);
    free(p->first);
    free(p->free_head);
    free(p->free_tail);
    free(p->n_free_in);
    free(p);
}

int kaon_kv_pool_n_blocks(const kaon_kv_pool *p) { return p->n_blocks; }
int kaon_kv_pool_n_free(const kaon_kv_pool *p) { return p->n_free; }  // engine thread only
int kaon_kv_pool_n_parts(const kaon_kv_pool *p) { return p->n_parts; }
int kaon_kv_part_first(const kaon_kv_pool *p, int part) { return p->first[part]; }
int kaon_kv_part_n_blocks(const kaon_kv_pool *p, int part) { return p->first[part + 1] - p->first[part]; }
int kaon_kv_part_n_free(const kaon_kv_pool *p, int part) { return p->n_free_in[part]; }

uint64_t kaon_kv_part_root(int part) { return part ? 0x6a09e667f3bcc909ull * (uint64_t)part : 0; }

uint64_t kaon_kv_block_hash(uint64_t parent, const int32_t *tokens, int n) {
    uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) {
        h ^= (uint32_t)tokens[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    h ^= h >> 29;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 32;
    return h ? h : 1;
}

static bool same_content(const kaon_kv_pool *p, int i, uint64_t parent, const int32_t *tokens) {
    return p->b[i].parent == parent &&
           !memcmp(p->tokens + (size_t)i * p->block_size, tokens, sizeof(int32_t) * p->block_size);
}

// The table slot holding block i (whose hash is `hash`), or NULL.
static int32_t *slot_of_block(kaon_kv_pool *p, uint64_t hash, int i) {
    uint32_t k = (uint32_t)hash & p->table_mask;
    for (uint32_t probes = 0; probes <= p->table_mask; probes++, k = (k + 1) & p->table_mask) {
        if (p->table[k] == -1) return NULL;
        if (p->table[k] == i) return &p->table[k];
    }
    return NULL;
}

// The table slot of the block holding exactly (parent, tokens), or NULL.
static int32_t *slot_of_content(kaon_kv_pool *p, uint64_t hash, uint64_t parent,
                                const int32_t *tokens) {
    uint32_t k = (uint32_t)hash & p->table_mask;
    for (uint32_t probes = 0; probes <= p->table_mask; probes++, k = (k + 1) & p->table_mask) {
        int32_t v = p->table[k];
        if (v == -1) return NULL;
        if (v >= 0 && p->b[v].hash == hash && same_content(p, v, parent, tokens)) return &p->table[k];
    }
    return NULL;
}

static void unhash(kaon_kv_pool *p, int i) {
    if (!p->b[i].hashed) return;
    int32_t *s = slot_of_block(p, p->b[i].hash, i);
    if (s) {
        *s = -2;
        p->n_tombstones++;
    }
    p->b[i].hashed = false;
}

static void insert(kaon_kv_pool *p, uint64_t hash, int i) {
    uint32_t k = (uint32_t)hash & p->table_mask;
    while (p->table[k] >= 0) k = (k + 1) & p->table_mask;
    if (p->table[k] == -2) p->n_tombstones--;
    p->table[k] = i;
}

// Lookups of absent keys stop only at empty slots, so tombstones must not take them all.
static void rebuild_if_needed(kaon_kv_pool *p) {
    if (p->n_tombstones <= (p->table_mask + 1) / 4) return;
    memset(p->table, 0xff, sizeof(int32_t) * (p->table_mask + 1));
    p->n_tombstones = 0;
    for (int i = 0; i < p->n_blocks; i++)
        if (p->b[i].hashed) insert(p, p->b[i].hash, i);
}

int kaon_kv_alloc(kaon_kv_pool *p) { return kaon_kv_alloc_in(p, 0); }

int kaon_kv_alloc_in(kaon_kv_pool *p, int part) {
    pthread_mutex_lock(&p->mu);
    int i = p->free_head[part];
    if (i >= 0) {
        list_remove(p, i);
        unhash(p, i);
        p->b[i].ref = 1;
    }
    pthread_mutex_unlock(&p->mu);
    return i;
}

void kaon_kv_release(kaon_kv_pool *p, int i) {
    if (i < 0 || i >= p->n_blocks) return;
    pthread_mutex_lock(&p->mu);
    if (p->b[i].ref > 0 && --p->b[i].ref == 0) list_push_tail(p, i);
    pthread_mutex_unlock(&p->mu);
}

bool kaon_kv_cached(kaon_kv_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    return slot_of_content(p, hash, parent, tokens) != NULL;
}

int kaon_kv_lookup(kaon_kv_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    pthread_mutex_lock(&p->mu);
    int32_t *s = slot_of_content(p, hash, parent, tokens);
    int i = s ? *s : -1;
    if (i >= 0) {
        if (p->b[i].ref == 0) list_remove(p, i);
        p->b[i].ref++;
    }
    pthread_mutex_unlock(&p->mu);
    return i;
}

void kaon_kv_commit(kaon_kv_pool *p, int i, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    if (i < 0 || i >= p->n_blocks) return;
    pthread_mutex_lock(&p->mu);
    // Not when named already, nor when the same content is cached in another block.
    if (!p->b[i].hashed && !slot_of_content(p, hash, parent, tokens)) {
        rebuild_if_needed(p);
        insert(p, hash, i);
        p->b[i].hashed = true;
        p->b[i].hash = hash;
        p->b[i].parent = parent;
        memcpy(p->tokens + (size_t)i * p->block_size, tokens, sizeof(int32_t) * p->block_size);
    }
    pthread_mutex_unlock(&p->mu);
}

int kaon_kv_count_cached(kaon_kv_pool *p, const int32_t *tokens, int n_blocks) {
    // The chain's hashes first, outside the lock (the engine thread waits on it).
    enum { CHUNK = 64 };
    uint64_t hash[CHUNK], parent = 0;
    int hits = 0;
    for (int at = 0; at < n_blocks; at += CHUNK) {
        const int n = n_blocks - at < CHUNK ? n_blocks - at : CHUNK;
        for (int k = 0; k < n; k++) {
            const int32_t *toks = tokens + (size_t)(at + k) * p->block_size;
            hash[k] = kaon_kv_block_hash(k ? hash[k - 1] : parent, toks, p->block_size);
        }
        pthread_mutex_lock(&p->mu);
        int k = 0;
        for (; k < n; k++) {
            const int32_t *toks = tokens + (size_t)(at + k) * p->block_size;
            if (!slot_of_content(p, hash[k], k ? hash[k - 1] : parent, toks)) break;
        }
        pthread_mutex_unlock(&p->mu);
        hits += k;
        if (k < n) break;
        parent = hash[n - 1];
    }
    return hits;
}
