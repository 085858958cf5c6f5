// The KV block pool: fixed-size blocks with reference counts, and the prefix cache. A full
// block is named by a hash chained over its tokens and its parent's hash; a new sequence
// reuses every block whose chain matches (verified token by token, so a hash collision can
// never alias two prefixes). Freed blocks keep their hash until the LRU free list hands them
// out again.
#ifndef KAON_ENGINE_KV_CACHE_H
#define KAON_ENGINE_KV_CACHE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kaon_kv_pool kaon_kv_pool;

kaon_kv_pool *kaon_kv_pool_create(int n_blocks, int block_size);
// Data-parallel attention: n_parts parts, part r the blocks [r N / n_parts, (r + 1) N / n_parts)
// (N = n_blocks), each with its own free list. A sequence of rank r takes blocks of part r only
// and chains its block hashes from kaon_kv_part_root(r), so its prefix hits are blocks of its
// own part (the same prefix cached on two ranks is two chains).
kaon_kv_pool *kaon_kv_pool_create_parts(int n_blocks, int block_size, int n_parts);
int kaon_kv_pool_n_parts(const kaon_kv_pool *p);
int kaon_kv_part_first(const kaon_kv_pool *p, int part);
int kaon_kv_part_n_blocks(const kaon_kv_pool *p, int part);
int kaon_kv_part_n_free(const kaon_kv_pool *p, int part);
uint64_t kaon_kv_part_root(int part);  // the parent hash of a part's first blocks (0 for part 0)
void kaon_kv_pool_free(kaon_kv_pool *p);

int kaon_kv_pool_n_blocks(const kaon_kv_pool *p);
int kaon_kv_pool_n_free(const kaon_kv_pool *p);  // free blocks (cached ones included)

// Takes the least recently freed block (dropping its cached hash). -1 when none is free.
int kaon_kv_alloc(kaon_kv_pool *p);  // from part 0
int kaon_kv_alloc_in(kaon_kv_pool *p, int part);
// Drops one reference; at zero the block joins the tail of the free list, hash kept.
void kaon_kv_release(kaon_kv_pool *p, int block);

uint64_t kaon_kv_block_hash(uint64_t parent, const int32_t *tokens, int n);

// Finds the cached block holding exactly (parent, tokens) and takes a reference. -1 if none.
int kaon_kv_lookup(kaon_kv_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens);
// How many of the n_blocks full blocks at tokens ([n_blocks, block_size]) lead a chain that
// is cached, without taking references or touching the LRU order. Safe from any thread while
// the engine thread uses the pool (the pool's functions take its lock).
int kaon_kv_count_cached(kaon_kv_pool *p, const int32_t *tokens, int n_blocks);
// Whether such a block is cached, without taking it.
bool kaon_kv_cached(kaon_kv_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens);
// Names a full, computed block so later sequences can reuse it.
void kaon_kv_commit(kaon_kv_pool *p, int block, uint64_t hash, uint64_t parent,
                    const int32_t *tokens);

#endif
