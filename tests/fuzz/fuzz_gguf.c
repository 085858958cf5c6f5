// libFuzzer target for the GGUF reader: parse any bytes, then walk every key, array element
// and tensor, checking the reader's invariants (lookups agree with indexes, data in bounds).
// Both ways of opening: strict (model loading) and metadata-only (tensors of any type); what
// the strict reader accepts, the metadata reader accepts too.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/gguf.h"

static volatile uint64_t sink;

static void touch(const void *p, uint64_t n) {
    if (!n) return;
    const uint8_t *b = p;
    sink += b[0] + b[n - 1];
}

// The key as a C string, or NULL when it holds a NUL byte (then lookups cannot name it).
static char *cstr(kaon_gguf_str s) {
    if (s.len && memchr(s.ptr, 0, s.len)) return NULL;
    char *c = malloc(s.len + 1);
    if (!c) abort();
    if (s.len) memcpy(c, s.ptr, s.len);
    c[s.len] = 0;
    return c;
}

static uint64_t elem_size(enum kaon_gguf_type t) {
    switch (t) {
    case KAON_GGUF_U8: case KAON_GGUF_I8: case KAON_GGUF_BOOL: return 1;
    case KAON_GGUF_U16: case KAON_GGUF_I16: return 2;
    case KAON_GGUF_U32: case KAON_GGUF_I32: case KAON_GGUF_F32: return 4;
    case KAON_GGUF_U64: case KAON_GGUF_I64: case KAON_GGUF_F64: return 8;
    default: return 0;
    }
}

static void check(kaon_gguf *g, const uint8_t *data, size_t size) {
    const uint8_t *end = data + size;
    uint32_t a = kaon_gguf_alignment(g);
    if (a == 0 || (a & (a - 1))) abort();
    for (int64_t i = 0; i < kaon_gguf_kv_count(g); i++) {
        kaon_gguf_str k = kaon_gguf_key(g, i);
        touch(k.ptr, k.len);
        char *key = cstr(k);
        if (!key) continue;
        if (kaon_gguf_find_key(g, key) != i) abort();  // keys are unique
        enum kaon_gguf_type t = kaon_gguf_kv_type(g, i);
        sink += (uint64_t)kaon_gguf_get_int(g, key, 0);
        sink += kaon_gguf_get_float(g, key, 0) > 0.5;
        sink += kaon_gguf_get_bool(g, key, false);
        kaon_gguf_str s;
        if (kaon_gguf_get_str(g, key, &s) != (t == KAON_GGUF_STRING)) abort();
        if (t == KAON_GGUF_STRING) {
            if ((const uint8_t *)s.ptr < data || s.len > (uint64_t)(end - (const uint8_t *)s.ptr))
                abort();
            touch(s.ptr, s.len);
        }
        enum kaon_gguf_type et;
        uint64_t n;
        if (kaon_gguf_get_array(g, key, &et, &n) != (t == KAON_GGUF_ARRAY)) abort();
        if (t == KAON_GGUF_ARRAY) {
            if (et == KAON_GGUF_STRING) {
                for (uint64_t j = 0; j < n; j++) {
                    kaon_gguf_str e = kaon_gguf_array_str(g, key, j);
                    if (!e.ptr || (const uint8_t *)e.ptr < data ||
                        e.len > (uint64_t)(end - (const uint8_t *)e.ptr))
                        abort();
                    touch(e.ptr, e.len);
                }
                if (kaon_gguf_array_str(g, key, n).ptr) abort();
            } else if (elem_size(et)) {
                const uint8_t *p = kaon_gguf_array_data(g, key);
                if (!p || p < data || n > (uint64_t)(end - p) / elem_size(et)) abort();
                touch(p, n * elem_size(et));
            }
        }
        free(key);
    }
    for (int64_t i = 0; i < kaon_gguf_tensor_count(g); i++) {
        const kaon_gguf_tensor *t = kaon_gguf_tensor_at(g, i);
        const uint8_t *d = t->data;
        if (t->unsized ? (d || t->nbytes) : (d < data || t->nbytes > (uint64_t)(end - d)) || t->offset % a)
            abort();
        touch(d, t->nbytes);
        char *name = cstr(t->name);
        if (name && kaon_gguf_find_tensor(g, name) != t) abort();  // names are unique
        free(name);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kaon_gguf *g = kaon_gguf_open_memory(data, size);
    if (g) check(g, data, size);
    kaon_gguf *m = kaon_gguf_open_memory_metadata(data, size);
    if (g && !m) abort();
    if (m) check(m, data, size);
    kaon_gguf_close(g);
    kaon_gguf_close(m);
    return 0;
}
