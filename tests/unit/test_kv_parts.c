// The KV pool's data-parallel parts (engine/kv_cache.h): each part hands out its own blocks,
// its free count moves alone, and the same prefix cached by two parts is two chains.
#include <stdint.h>

#include "engine/kv_cache.h"
#include "test.h"

int main(void) {
    // 10 blocks over 3 parts: [0, 3), [3, 6), [6, 10).
    kaon_kv_pool *p = kaon_kv_pool_create_parts(10, 2, 3);
    CHECK(p && kaon_kv_pool_n_parts(p) == 3);
    CHECK(kaon_kv_part_first(p, 1) == 3 && kaon_kv_part_n_blocks(p, 1) == 3 && kaon_kv_part_n_blocks(p, 2) == 4);
    int got[4];
    for (int i = 0; i < 4; i++) got[i] = kaon_kv_alloc_in(p, 2);
    for (int i = 0; i < 4; i++) CHECK(got[i] >= 6 && got[i] < 10);
    CHECK(kaon_kv_alloc_in(p, 2) == -1);  // dry, while the other parts are full
    CHECK(kaon_kv_part_n_free(p, 2) == 0 && kaon_kv_part_n_free(p, 0) == 3 && kaon_kv_pool_n_free(p) == 6);
    const int b1 = kaon_kv_alloc_in(p, 1);
    CHECK(b1 >= 3 && b1 < 6 && kaon_kv_part_n_free(p, 1) == 2);

    // The same two tokens committed by parts 1 and 2: found only under each part's root.
    const int32_t toks[2] = {7, 8};
    const uint64_t r1 = kaon_kv_part_root(1), r2 = kaon_kv_part_root(2);
    CHECK(kaon_kv_part_root(0) == 0 && r1 != r2);
    const uint64_t h1 = kaon_kv_block_hash(r1, toks, 2), h2 = kaon_kv_block_hash(r2, toks, 2);
    kaon_kv_commit(p, b1, h1, r1, toks);
    kaon_kv_commit(p, got[0], h2, r2, toks);
    CHECK(kaon_kv_cached(p, h1, r1, toks) && kaon_kv_cached(p, h2, r2, toks));
    CHECK(!kaon_kv_cached(p, kaon_kv_block_hash(0, toks, 2), 0, toks));
    kaon_kv_release(p, b1);
    CHECK(kaon_kv_part_n_free(p, 1) == 3);
    CHECK(kaon_kv_lookup(p, h1, r1, toks) == b1 && kaon_kv_part_n_free(p, 1) == 2);
    kaon_kv_pool_free(p);

    CHECK(kaon_kv_pool_create_parts(2, 4, 3) == NULL);  // a part without blocks
    TEST_MAIN_END();
}
