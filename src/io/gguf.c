// GGUF v2/v3 reader.
//
// Layout (little-endian):
//   "GGUF" | u32 version | u64 n_tensors | u64 n_kv | kv[n_kv] | tensor_info[n_tensors]
//   | padding to general.alignment | tensor data
// The file is mmapped read-only and parsed in place: keys, strings and tensor data point into
// the mapping. The only allocations are the kv/tensor tables, two hash indexes (keys, tensor
// names) and, for every top-level array of strings, a table of element pointers so that
// kaon_gguf_array_str is O(1) (tokenizer.ggml.tokens holds ~50k-150k strings).
//
// The file is untrusted: every count is bounded by the bytes left before anything is
// allocated (a kv needs >= 13 bytes, a tensor info >= 32, an array element >= its size), every
// read is bounds checked, nested arrays are limited in depth, and sizes are overflow checked.
#include "io/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/tensor.h"
#include "util/err.h"

#define GGUF_HEADER_BYTES 24
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ARRAY_DEPTH 8      // arrays nested deeper are rejected (bounds the recursion)
#define GGUF_MIN_KV_BYTES 13        // u64 key length + u32 type + 1 value byte
#define GGUF_MIN_TENSOR_BYTES 32    // u64 name length + u32 n_dims + 1 dim + u32 type + u64 offset
#define GGUF_MAX_ENTRIES 0x7fffffffu  // hash slots hold 32-bit indices

typedef struct gguf_kv {
    kaon_gguf_str key;
    uint32_t type;
    const uint8_t *val;          // the value; for arrays, the first element
    uint32_t arr_type;           // arrays only
    uint64_t arr_count;
    const uint8_t **str_elems;   // arrays of strings: each element's u64 length field
} gguf_kv;

// Open addressing over (ptr, len) names; idx is the entry index.
typedef struct name_slot {
    const char *ptr;
    uint64_t len;
    uint32_t idx;
    uint32_t used;
} name_slot;

typedef struct name_index {
    name_slot *slots;
    uint64_t mask;
} name_index;

struct kaon_gguf {
    const uint8_t *base;
    size_t size;
    bool mapped;
    char *name;  // for messages: the path, or "<memory>"
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;
    int64_t n_kv;
    int64_t n_tensors;
    gguf_kv *kv;
    kaon_gguf_tensor *tensors;
    name_index kv_index;
    name_index tensor_index;
    bool metadata_only;  // kaon_gguf_open_metadata: tensors of any type
};

// ---- little-endian reads (independent of host byte order and alignment) --------------------

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32); }

static float rdf32(const uint8_t *p) {
    uint32_t b = rd32(p);
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static double rdf64(const uint8_t *p) {
    uint64_t b = rd64(p);
    double d;
    memcpy(&d, &b, 8);
    return d;
}

// Bytes of one scalar of type t; 0 for strings, arrays and unknown ids.
static uint64_t scalar_size(uint32_t t) {
    switch (t) {
    case KAON_GGUF_U8: case KAON_GGUF_I8: case KAON_GGUF_BOOL: return 1;
    case KAON_GGUF_U16: case KAON_GGUF_I16: return 2;
    case KAON_GGUF_U32: case KAON_GGUF_I32: case KAON_GGUF_F32: return 4;
    case KAON_GGUF_U64: case KAON_GGUF_I64: case KAON_GGUF_F64: return 8;
    default: return 0;
    }
}

static bool type_known(uint32_t t) { return t <= KAON_GGUF_F64; }

// Every ggml tensor type by id: its name, and elements and bytes per block (0: a type ggml
// removed, whose layout a file cannot use). kaon computes with the ones kaon_dtype_from_ggml
// maps; the others are named in messages and sized when only the metadata is read.
static const struct ggml_type_info {
    const char *name;
    uint32_t blck, size;
} ggml_types[] = {
    {"F32", 1, 4}, {"F16", 1, 2}, {"Q4_0", 32, 18}, {"Q4_1", 32, 20}, {"Q4_2", 0, 0},
    {"Q4_3", 0, 0}, {"Q5_0", 32, 22}, {"Q5_1", 32, 24}, {"Q8_0", 32, 34}, {"Q8_1", 32, 40},
    {"Q2_K", 256, 84}, {"Q3_K", 256, 110}, {"Q4_K", 256, 144}, {"Q5_K", 256, 176},
    {"Q6_K", 256, 210}, {"Q8_K", 256, 292}, {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74},
    {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50}, {"IQ4_NL", 32, 18}, {"IQ3_S", 256, 110},
    {"IQ2_S", 256, 82}, {"IQ4_XS", 256, 136}, {"I8", 1, 1}, {"I16", 1, 2}, {"I32", 1, 4},
    {"I64", 1, 8}, {"F64", 1, 8}, {"IQ1_M", 256, 56}, {"BF16", 1, 2}, {"Q4_0_4_4", 0, 0},
    {"Q4_0_4_8", 0, 0}, {"Q4_0_8_8", 0, 0}, {"TQ1_0", 256, 54}, {"TQ2_0", 256, 66},
    {"IQ4_NL_4_4", 0, 0}, {"IQ4_NL_4_8", 0, 0}, {"IQ4_NL_8_8", 0, 0}, {"MXFP4", 32, 17},
    {"NVFP4", 64, 36}, {"Q1_0", 128, 18},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const char *kaon_gguf_type_name(uint32_t t) { return t < N_GGML_TYPES ? ggml_types[t].name : "unknown"; }

bool kaon_gguf_type_block(uint32_t t, uint32_t *blck, uint32_t *size) {
    if (t >= N_GGML_TYPES || ggml_types[t].blck == 0) return false;
    *blck = ggml_types[t].blck;
    *size = ggml_types[t].size;
    return true;
}

// A short printable copy of an untrusted name for error messages.
static const char *printable(const char *p, uint64_t len, char *buf, size_t cap) {
    size_t n = 0;
    uint64_t i = 0;
    for (; i < len && n + 4 < cap; i++) {
        unsigned char ch = (unsigned char)p[i];
        buf[n++] = (ch >= 0x20 && ch < 0x7f) || ch >= 0x80 ? (char)ch : '?';
    }
    if (i < len) { buf[n++] = '.'; buf[n++] = '.'; buf[n++] = '.'; }
    buf[n] = 0;
    return buf;
}

// ---- name index ----------------------------------------------------------------------------

static uint64_t hash_name(const char *p, uint64_t len) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (uint64_t i = 0; i < len; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int index_init(name_index *ix, uint64_t n) {
    uint64_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    ix->slots = calloc(cap, sizeof *ix->slots);
    ix->mask = cap - 1;
    return ix->slots ? 0 : -1;
}

// Inserts (p, len) -> idx. Returns -1 when inserted, else the index already holding the name.
static int64_t index_insert(name_index *ix, const char *p, uint64_t len, uint32_t idx) {
    uint64_t h = hash_name(p, len) & ix->mask;
    for (;; h = (h + 1) & ix->mask) {
        name_slot *s = &ix->slots[h];
        if (!s->used) {
            *s = (name_slot){p, len, idx, 1};
            return -1;
        }
        if (s->len == len && (len == 0 || !memcmp(s->ptr, p, len))) return s->idx;
    }
}

static int64_t index_find(const name_index *ix, const char *p, uint64_t len) {
    if (!ix->slots) return -1;
    uint64_t h = hash_name(p, len) & ix->mask;
    for (;; h = (h + 1) & ix->mask) {
        const name_slot *s = &ix->slots[h];
        if (!s->used) return -1;
        if (s->len == len && (len == 0 || !memcmp(s->ptr, p, len))) return s->idx;
    }
}

// ---- parsing -------------------------------------------------------------------------------

typedef struct cursor {
    const uint8_t *base;
    uint64_t pos, size;
} cursor;

static uint64_t left(const cursor *c) { return c->size - c->pos; }

// Reads a string header; the bytes stay in the mapping.
static int read_str(const kaon_gguf *g, cursor *c, kaon_gguf_str *s, const char *what) {
    if (left(c) < 8)
        return kaon_set_error("%s: truncated at byte %llu: %s length needs 8 bytes", g->name,
                              (unsigned long long)c->pos, what);
    uint64_t len = rd64(c->base + c->pos);
    if (len > left(c) - 8)
        return kaon_set_error("%s: %s at byte %llu has length %llu, past the end of the file "
                              "(size %llu)", g->name, what, (unsigned long long)c->pos,
                              (unsigned long long)len, (unsigned long long)c->size);
    s->ptr = (const char *)c->base + c->pos + 8;
    s->len = len;
    c->pos += 8 + len;
    return 0;
}

// Walks the elements of an array (its type and count already read). When str_elems is given
// (a top-level array of strings) it receives a pointer to each element.
static int walk_array(const kaon_gguf *g, cursor *c, uint32_t type, uint64_t count, int depth,
                      const uint8_t **str_elems, const char *key) {
    if (!type_known(type))
        return kaon_set_error("%s: metadata '%s': array element type %u is unknown", g->name, key,
                              type);
    uint64_t es = scalar_size(type);
    if (es) {
        if (count > left(c) / es)
            return kaon_set_error("%s: metadata '%s': array of %llu elements of %llu bytes at byte "
                                  "%llu runs past the end of the file (size %llu)", g->name, key,
                                  (unsigned long long)count, (unsigned long long)es,
                                  (unsigned long long)c->pos, (unsigned long long)c->size);
        c->pos += count * es;
        return 0;
    }
    if (type == KAON_GGUF_STRING) {
        if (count > left(c) / 8)
            return kaon_set_error("%s: metadata '%s': array of %llu strings cannot fit in the %llu "
                                  "bytes left", g->name, key, (unsigned long long)count,
                                  (unsigned long long)left(c));
        for (uint64_t i = 0; i < count; i++) {
            kaon_gguf_str s;
            const uint8_t *at = c->base + c->pos;
            if (read_str(g, c, &s, "array string")) return -1;
            if (str_elems) str_elems[i] = at;
        }
        return 0;
    }
    // Nested arrays: each element is u32 type + u64 count + elements.
    if (depth >= GGUF_MAX_ARRAY_DEPTH)
        return kaon_set_error("%s: metadata '%s': arrays nested deeper than %d levels", g->name,
                              key, GGUF_MAX_ARRAY_DEPTH);
    if (count > left(c) / 12)
        return kaon_set_error("%s: metadata '%s': array of %llu arrays cannot fit in the %llu bytes "
                              "left", g->name, key, (unsigned long long)count,
                              (unsigned long long)left(c));
    for (uint64_t i = 0; i < count; i++) {
        if (left(c) < 12)
            return kaon_set_error("%s: metadata '%s': truncated nested array header at byte %llu",
                                  g->name, key, (unsigned long long)c->pos);
        uint32_t t = rd32(c->base + c->pos);
        uint64_t n = rd64(c->base + c->pos + 4);
        c->pos += 12;
        if (walk_array(g, c, t, n, depth + 1, NULL, key)) return -1;
    }
    return 0;
}

static int parse_kv(kaon_gguf *g, cursor *c, int64_t i) {
    gguf_kv *kv = &g->kv[i];
    char kbuf[96];
    char what[64];
    snprintf(what, sizeof what, "metadata key #%lld", (long long)i);
    if (read_str(g, c, &kv->key, what)) return -1;
    const char *key = printable(kv->key.ptr, kv->key.len, kbuf, sizeof kbuf);
    if (left(c) < 4)
        return kaon_set_error("%s: truncated at byte %llu: type of metadata '%s'", g->name,
                              (unsigned long long)c->pos, key);
    kv->type = rd32(c->base + c->pos);
    c->pos += 4;
    if (!type_known(kv->type))
        return kaon_set_error("%s: metadata '%s' has unknown value type %u", g->name, key, kv->type);
    kv->val = c->base + c->pos;
    uint64_t es = scalar_size(kv->type);
    if (es) {
        if (left(c) < es)
            return kaon_set_error("%s: truncated at byte %llu: value of metadata '%s'", g->name,
                                  (unsigned long long)c->pos, key);
        c->pos += es;
    } else if (kv->type == KAON_GGUF_STRING) {
        kaon_gguf_str s;
        if (read_str(g, c, &s, key)) return -1;
    } else {  // array
        if (left(c) < 12)
            return kaon_set_error("%s: truncated at byte %llu: array header of metadata '%s'",
                                  g->name, (unsigned long long)c->pos, key);
        kv->arr_type = rd32(c->base + c->pos);
        kv->arr_count = rd64(c->base + c->pos + 4);
        c->pos += 12;
        kv->val = c->base + c->pos;
        if (kv->arr_type == KAON_GGUF_STRING && kv->arr_count <= left(c) / 8) {
            // Bounded by the bytes left, so the table is never larger than the file.
            kv->str_elems = malloc((kv->arr_count ? kv->arr_count : 1) * sizeof *kv->str_elems);
            if (!kv->str_elems) return kaon_set_error("%s: out of memory", g->name);
        }
        if (walk_array(g, c, kv->arr_type, kv->arr_count, 1, kv->str_elems, key)) return -1;
    }
    int64_t dup = index_insert(&g->kv_index, kv->key.ptr, kv->key.len, (uint32_t)i);
    if (dup >= 0)
        return kaon_set_error("%s: duplicate metadata key '%s' (entries %lld and %lld)", g->name,
                              key, (long long)dup, (long long)i);
    return 0;
}

static int parse_tensor_info(kaon_gguf *g, cursor *c, int64_t i) {
    kaon_gguf_tensor *t = &g->tensors[i];
    char nbuf[96];
    char what[64];
    snprintf(what, sizeof what, "name of tensor #%lld", (long long)i);
    if (read_str(g, c, &t->name, what)) return -1;
    const char *name = printable(t->name.ptr, t->name.len, nbuf, sizeof nbuf);
    if (left(c) < 4)
        return kaon_set_error("%s: truncated at byte %llu: tensor '%s' n_dims", g->name,
                              (unsigned long long)c->pos, name);
    t->n_dims = rd32(c->base + c->pos);
    c->pos += 4;
    if (t->n_dims < 1 || t->n_dims > 4)
        return kaon_set_error("%s: tensor '%s' has %u dimensions (kaon reads 1 to 4)", g->name,
                              name, t->n_dims);
    if (left(c) < 8ull * t->n_dims + 12)
        return kaon_set_error("%s: truncated at byte %llu: tensor '%s' info", g->name,
                              (unsigned long long)c->pos, name);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        t->dims[d] = rd64(c->base + c->pos + 8ull * d);
        if (t->dims[d] == 0)
            return kaon_set_error("%s: tensor '%s' has dimension %u of size 0", g->name, name, d);
        if (t->dims[d] > (uint64_t)INT64_MAX / numel)
            return kaon_set_error("%s: tensor '%s': element count overflows (dimension %u = %llu)",
                                  g->name, name, d, (unsigned long long)t->dims[d]);
        numel *= t->dims[d];
    }
    for (uint32_t d = t->n_dims; d < 4; d++) t->dims[d] = 1;
    c->pos += 8ull * t->n_dims;
    t->ggml_type = rd32(c->base + c->pos);
    t->offset = rd64(c->base + c->pos + 4);
    c->pos += 12;
    kaon_dtype dt = kaon_dtype_from_ggml(t->ggml_type);
    uint32_t blck = 0, size = 0;
    if (dt != KAON_DTYPE_INVALID) {
        blck = (uint32_t)kaon_dtype_block_elems(dt);
        size = (uint32_t)kaon_dtype_block_bytes(dt);
    } else if (!g->metadata_only) {
        return kaon_set_error("%s: tensor '%s' has ggml type %u (%s), which kaon does not support",
                              g->name, name, t->ggml_type, kaon_gguf_type_name(t->ggml_type));
    } else if (!kaon_gguf_type_block(t->ggml_type, &blck, &size)) {
        t->nbytes = 0;  // a layout kaon does not know: the data stays unread (data NULL)
        t->unsized = true;
    }
    if (!t->unsized) {
        const uint64_t be = blck, bb = size;
        if (t->dims[0] % be)
            return kaon_set_error("%s: tensor '%s': row length %llu is not a multiple of the %s block "
                                  "size %llu", g->name, name, (unsigned long long)t->dims[0],
                                  kaon_gguf_type_name(t->ggml_type), (unsigned long long)be);
        uint64_t blocks = numel / be;
        if (blocks > UINT64_MAX / bb)
            return kaon_set_error("%s: tensor '%s': byte size overflows", g->name, name);
        t->nbytes = blocks * bb;
    }
    if (t->offset % g->alignment)
        return kaon_set_error("%s: tensor '%s' data offset %llu is not a multiple of the alignment "
                              "%u", g->name, name, (unsigned long long)t->offset, g->alignment);
    int64_t dup = index_insert(&g->tensor_index, t->name.ptr, t->name.len, (uint32_t)i);
    if (dup >= 0)
        return kaon_set_error("%s: duplicate tensor name '%s' (tensors %lld and %lld)", g->name,
                              name, (long long)dup, (long long)i);
    return 0;
}

static int read_alignment(kaon_gguf *g) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = index_find(&g->kv_index, "general.alignment", 17);
    if (i < 0) return 0;
    const gguf_kv *kv = &g->kv[i];
    if (kv->type != KAON_GGUF_U32)
        return kaon_set_error("%s: general.alignment must be a u32 (it has type %u)", g->name,
                              kv->type);
    uint32_t a = rd32(kv->val);
    if (a == 0 || (a & (a - 1)))
        return kaon_set_error("%s: general.alignment %u is not a nonzero power of two", g->name, a);
    g->alignment = a;
    return 0;
}

static int parse(kaon_gguf *g) {
    cursor c = {g->base, 0, g->size};
    if (g->size < 4 || memcmp(g->base, "GGUF", 4)) {
        if (g->size < 4)
            return kaon_set_error("%s: not a GGUF file (only %zu bytes)", g->name, g->size);
        return kaon_set_error("%s: not a GGUF file (magic bytes %02x %02x %02x %02x, expected "
                              "\"GGUF\")", g->name, g->base[0], g->base[1], g->base[2], g->base[3]);
    }
    if (g->size < GGUF_HEADER_BYTES)
        return kaon_set_error("%s: truncated GGUF header (%zu bytes, need %d)", g->name, g->size,
                              GGUF_HEADER_BYTES);
    g->version = rd32(g->base + 4);
    if (g->version == 1)
        return kaon_set_error("%s: GGUF version 1 is not supported (kaon reads v2 and v3; "
                              "re-convert the model)", g->name);
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0)
            return kaon_set_error("%s: GGUF file is big-endian (version field 0x%08x); kaon reads "
                                  "little-endian files only", g->name, g->version);
        return kaon_set_error("%s: unsupported GGUF version %u (kaon reads v2 and v3)", g->name,
                              g->version);
    }
    uint64_t n_tensors = rd64(g->base + 8), n_kv = rd64(g->base + 16);
    c.pos = GGUF_HEADER_BYTES;
    // Counts are bounded by the bytes that could hold them before anything is allocated.
    uint64_t rest = left(&c);
    if (n_kv > rest / GGUF_MIN_KV_BYTES || n_kv > GGUF_MAX_ENTRIES)
        return kaon_set_error("%s: metadata count %llu cannot fit in the %llu bytes after the "
                              "header", g->name, (unsigned long long)n_kv, (unsigned long long)rest);
    if (n_tensors > rest / GGUF_MIN_TENSOR_BYTES || n_tensors > GGUF_MAX_ENTRIES)
        return kaon_set_error("%s: tensor count %llu cannot fit in the %llu bytes after the header",
                              g->name, (unsigned long long)n_tensors, (unsigned long long)rest);
    if (n_kv * GGUF_MIN_KV_BYTES + n_tensors * GGUF_MIN_TENSOR_BYTES > rest)  // each term <= rest
        return kaon_set_error("%s: %llu metadata entries and %llu tensor infos cannot fit in the "
                              "%llu bytes after the header", g->name, (unsigned long long)n_kv,
                              (unsigned long long)n_tensors, (unsigned long long)rest);
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_tensors;
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors || index_init(&g->kv_index, n_kv) ||
        index_init(&g->tensor_index, n_tensors))
        return kaon_set_error("%s: out of memory", g->name);

    for (int64_t i = 0; i < g->n_kv; i++)
        if (parse_kv(g, &c, i)) return -1;
    if (read_alignment(g)) return -1;
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (parse_tensor_info(g, &c, i)) return -1;

    // The data section starts at the next multiple of the alignment (c.pos <= size < 2^63, so
    // this cannot overflow).
    g->data_offset = (c.pos + g->alignment - 1) / g->alignment * g->alignment;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        kaon_gguf_tensor *t = &g->tensors[i];
        if (t->unsized) continue;
        uint64_t start = g->data_offset + t->offset;
        if (start < t->offset) start = UINT64_MAX;  // saturate for the message
        if (g->data_offset > g->size || t->offset > g->size - g->data_offset ||
            t->nbytes > g->size - g->data_offset - t->offset) {
            char nbuf[96];
            uint64_t end = start + t->nbytes < start ? UINT64_MAX : start + t->nbytes;
            return kaon_set_error("%s: tensor '%s' data [%llu, %llu) lies outside the file "
                                  "(size %zu)", g->name,
                                  printable(t->name.ptr, t->name.len, nbuf, sizeof nbuf),
                                  (unsigned long long)start, (unsigned long long)end, g->size);
        }
        t->data = g->base + start;
    }
    return 0;
}

static kaon_gguf *open_buffer(const void *data, size_t size, bool mapped, const char *name,
                              bool metadata_only) {
    kaon_gguf *g = calloc(1, sizeof *g);
    char *nm = strdup(name);
    if (!g || !nm) {
        free(g);
        free(nm);
        kaon_set_error("%s: out of memory", name);
        return NULL;
    }
    g->base = data;
    g->size = size;
    g->mapped = mapped;
    g->name = nm;
    g->metadata_only = metadata_only;
    if (parse(g)) {
        g->mapped = false;  // the caller unmaps on failure
        kaon_gguf_close(g);
        return NULL;
    }
    return g;
}

static kaon_gguf *open_memory(const void *data, size_t size, bool metadata_only) {
    if (!data && size) {
        kaon_set_error("<memory>: NULL buffer");
        return NULL;
    }
    static const uint8_t empty[1];
    return open_buffer(data ? data : empty, size, false, "<memory>", metadata_only);
}

kaon_gguf *kaon_gguf_open_memory(const void *data, size_t size) { return open_memory(data, size, false); }

kaon_gguf *kaon_gguf_open_memory_metadata(const void *data, size_t size) { return open_memory(data, size, true); }

static kaon_gguf *open_file(const char *path, bool metadata_only) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        kaon_set_error("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        kaon_set_error("%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    if (size == 0) {
        close(fd);
        kaon_set_error("%s: empty file, not a GGUF file", path);
        return NULL;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        kaon_set_error("%s: mmap failed: %s", path, strerror(errno));
        return NULL;
    }
    kaon_gguf *g = open_buffer(map, size, true, path, metadata_only);
    if (!g) munmap(map, size);
    return g;
}

kaon_gguf *kaon_gguf_open(const char *path) { return open_file(path, false); }

kaon_gguf *kaon_gguf_open_metadata(const char *path) { return open_file(path, true); }

void kaon_gguf_close(kaon_gguf *g) {
    if (!g) return;
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++) free(g->kv[i].str_elems);
    free(g->kv);
    free(g->tensors);
    free(g->kv_index.slots);
    free(g->tensor_index.slots);
    if (g->mapped) munmap((void *)g->base, g->size);
    free(g->name);
    free(g);
}

// ---- accessors -----------------------------------------------------------------------------

uint32_t kaon_gguf_version(const kaon_gguf *g) { return g ? g->version : 0; }
uint32_t kaon_gguf_alignment(const kaon_gguf *g) { return g ? g->alignment : 0; }
size_t kaon_gguf_file_size(const kaon_gguf *g) { return g ? g->size : 0; }
int64_t kaon_gguf_kv_count(const kaon_gguf *g) { return g ? g->n_kv : 0; }
int64_t kaon_gguf_tensor_count(const kaon_gguf *g) { return g ? g->n_tensors : 0; }

int64_t kaon_gguf_find_key(const kaon_gguf *g, const char *key) {
    if (!g || !key) return -1;
    return index_find(&g->kv_index, key, strlen(key));
}

kaon_gguf_str kaon_gguf_key(const kaon_gguf *g, int64_t i) {
    if (!g || i < 0 || i >= g->n_kv) return (kaon_gguf_str){NULL, 0};
    return g->kv[i].key;
}

enum kaon_gguf_type kaon_gguf_kv_type(const kaon_gguf *g, int64_t i) {
    // Out of range: a value outside the enum's members, never a valid type.
    if (!g || i < 0 || i >= g->n_kv) return (enum kaon_gguf_type)-1;
    return (enum kaon_gguf_type)g->kv[i].type;
}

static const gguf_kv *get_kv(const kaon_gguf *g, const char *key) {
    int64_t i = kaon_gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

// Reads an integer scalar of any width/sign; false when it is not one or exceeds int64.
static bool scalar_int(uint32_t type, const uint8_t *p, int64_t *out) {
    switch (type) {
    case KAON_GGUF_U8: *out = p[0]; return true;
    case KAON_GGUF_I8: *out = (int8_t)p[0]; return true;
    case KAON_GGUF_U16: *out = rd16(p); return true;
    case KAON_GGUF_I16: *out = (int16_t)rd16(p); return true;
    case KAON_GGUF_U32: *out = rd32(p); return true;
    case KAON_GGUF_I32: *out = (int32_t)rd32(p); return true;
    case KAON_GGUF_I64: *out = (int64_t)rd64(p); return true;
    case KAON_GGUF_U64: {
        uint64_t v = rd64(p);
        if (v > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)v;
        return true;
    }
    default: return false;
    }
}

int64_t kaon_gguf_get_int(const kaon_gguf *g, const char *key, int64_t dflt) {
    const gguf_kv *kv = get_kv(g, key);
    int64_t v;
    return kv && scalar_int(kv->type, kv->val, &v) ? v : dflt;
}

double kaon_gguf_get_float(const kaon_gguf *g, const char *key, double dflt) {
    const gguf_kv *kv = get_kv(g, key);
    if (!kv) return dflt;
    if (kv->type == KAON_GGUF_F32) return rdf32(kv->val);
    if (kv->type == KAON_GGUF_F64) return rdf64(kv->val);
    int64_t v;
    if (scalar_int(kv->type, kv->val, &v)) return (double)v;  // e.g. a freq_base written as int
    return dflt;
}

bool kaon_gguf_get_bool(const kaon_gguf *g, const char *key, bool dflt) {
    const gguf_kv *kv = get_kv(g, key);
    return kv && kv->type == KAON_GGUF_BOOL ? kv->val[0] != 0 : dflt;
}

bool kaon_gguf_get_str(const kaon_gguf *g, const char *key, kaon_gguf_str *out) {
    const gguf_kv *kv = get_kv(g, key);
    if (!kv || kv->type != KAON_GGUF_STRING) return false;
    out->len = rd64(kv->val);
    out->ptr = (const char *)kv->val + 8;
    return true;
}

bool kaon_gguf_get_array(const kaon_gguf *g, const char *key, enum kaon_gguf_type *elem_type,
                         uint64_t *count) {
    const gguf_kv *kv = get_kv(g, key);
    if (!kv || kv->type != KAON_GGUF_ARRAY) return false;
    if (elem_type) *elem_type = (enum kaon_gguf_type)kv->arr_type;
    if (count) *count = kv->arr_count;
    return true;
}

kaon_gguf_str kaon_gguf_array_str(const kaon_gguf *g, const char *key, uint64_t i) {
    const gguf_kv *kv = get_kv(g, key);
    if (!kv || kv->type != KAON_GGUF_ARRAY || !kv->str_elems || i >= kv->arr_count)
        return (kaon_gguf_str){NULL, 0};
    const uint8_t *e = kv->str_elems[i];
    return (kaon_gguf_str){(const char *)e + 8, rd64(e)};
}

// The elements may be unaligned in the file: read them with memcpy.
const void *kaon_gguf_array_data(const kaon_gguf *g, const char *key) {
    const gguf_kv *kv = get_kv(g, key);
    if (!kv || kv->type != KAON_GGUF_ARRAY || !scalar_size(kv->arr_type)) return NULL;
    return kv->val;
}

const kaon_gguf_tensor *kaon_gguf_tensor_at(const kaon_gguf *g, int64_t i) {
    if (!g || i < 0 || i >= g->n_tensors) return NULL;
    return &g->tensors[i];
}

const kaon_gguf_tensor *kaon_gguf_find_tensor(const kaon_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    int64_t i = index_find(&g->tensor_index, name, strlen(name));
    return i < 0 ? NULL : &g->tensors[i];
}

bool kaon_gguf_str_eq(kaon_gguf_str s, const char *c) {
    if (!c) return false;
    size_t n = strlen(c);
    return s.len == n && (n == 0 || (s.ptr && !memcmp(s.ptr, c, n)));
}
