// safetensors reader.
//
// File layout: u64 little-endian header length N | N bytes of JSON | data section. The JSON
// maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} with offsets
// relative to the data section; "__metadata__" (free-form strings) is ignored.
// A folder holds model.safetensors, or model.safetensors.index.json whose "weight_map" names
// the shard of every tensor; each shard is mapped once and every listed tensor must be in the
// shard named for it. Tensor data is handed out in place; its address is only as aligned as
// the file makes it (HF pads headers to 8 bytes).
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/json_util.h"
#include "util/err.h"

#define ST_MAX_HEADER (100u << 20)     // the reference implementation's limit
#define ST_MAX_INDEX_JSON (64u << 20)  // model.safetensors.index.json
#define ST_MAX_EXACT 9007199254740992.0  // 2^53: larger JSON numbers are not exact integers

typedef struct st_file {
    const uint8_t *base;
    size_t size;
    bool mapped;
    char *name;  // path (or "<memory>") for messages
} st_file;

typedef struct st_slot {
    const char *name;
    uint32_t idx;
    uint32_t used;
} st_slot;

struct kaon_safetensors {
    st_file *files;
    int n_files;
    kaon_st_tensor *tensors;
    int *tensor_file;  // which file each tensor lives in
    int64_t n_tensors, cap_tensors;
    st_slot *slots;  // open-addressing index of tensor names
    uint64_t mask;
    uint64_t n_slots_used;
};

// ---- name index ----------------------------------------------------------------------------

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int64_t index_find(const kaon_safetensors *st, const char *name) {
    if (!st->slots) return -1;
    for (uint64_t h = hash_str(name) & st->mask;; h = (h + 1) & st->mask) {
        const st_slot *s = &st->slots[h];
        if (!s->used) return -1;
        if (!strcmp(s->name, name)) return s->idx;
    }
}

static int index_grow(kaon_safetensors *st) {
    uint64_t cap = st->slots ? (st->mask + 1) * 2 : 64;
    st_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    if (st->slots) {
        for (uint64_t i = 0; i <= st->mask; i++) {
            if (!st->slots[i].used) continue;
            uint64_t h = hash_str(st->slots[i].name) & (cap - 1);
            while (slots[h].used) h = (h + 1) & (cap - 1);
            slots[h] = st->slots[i];
        }
    }
    free(st->slots);
    st->slots = slots;
    st->mask = cap - 1;
    return 0;
}

static int index_insert(kaon_safetensors *st, const char *name, uint32_t idx) {
    if (!st->slots || 2 * (st->n_slots_used + 1) > st->mask + 1)
        if (index_grow(st)) return -1;
    uint64_t h = hash_str(name) & st->mask;
    while (st->slots[h].used) h = (h + 1) & st->mask;
    st->slots[h] = (st_slot){name, idx, 1};
    st->n_slots_used++;
    return 0;
}

// ---- files ---------------------------------------------------------------------------------

static int map_file(const char *path, st_file *f) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kaon_set_error("%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return kaon_set_error("%s: not a regular file", path);
    }
    f->size = (size_t)sb.st_size;
    f->name = strdup(path);
    if (!f->name) {
        close(fd);
        return kaon_set_error("%s: out of memory", path);
    }
    if (f->size == 0) {  // parse() reports it; mmap cannot map 0 bytes
        static const uint8_t empty[1];
        f->base = empty;
        close(fd);
        return 0;
    }
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return kaon_set_error("%s: mmap failed: %s", path, strerror(errno));
    f->base = m;
    f->mapped = true;
    return 0;
}

// A JSON number that is an exact non-negative integer (< 2^53).
static bool json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d <= ST_MAX_EXACT)) return false;
    uint64_t u = (uint64_t)d;
    if ((double)u != d) return false;
    *out = u;
    return true;
}

static int dtype_from_name(const char *s, kaon_dtype *dt, int *elem_bytes) {
    if (!strcmp(s, "F32")) { *dt = KAON_F32; *elem_bytes = 4; return 0; }
    if (!strcmp(s, "F16")) { *dt = KAON_F16; *elem_bytes = 2; return 0; }
    if (!strcmp(s, "BF16")) { *dt = KAON_BF16; *elem_bytes = 2; return 0; }
    // FP8 weights; the loader insists on their scale companions (model/weights.c).
    if (!strcmp(s, "F8_E4M3")) { *dt = KAON_FP8_E4M3; *elem_bytes = 1; return 0; }
    // Packed INT4 words, g_idx and weight_shape (model/int4_weights.c unpacks them at load).
    if (!strcmp(s, "I32")) { *dt = KAON_I32; *elem_bytes = 4; return 0; }
    if (!strcmp(s, "I64")) { *dt = KAON_I64; *elem_bytes = 8; return 0; }
    // INT8 weights (compressed-tensors int-quantized), with their scales (model/fp8_weights.c).
    if (!strcmp(s, "I8")) { *dt = KAON_I8; *elem_bytes = 1; return 0; }
    // MXFP4 blocks and E8M0 scales (model/mxfp4_weights.c repacks them at load).
    if (!strcmp(s, "U8")) { *dt = KAON_U8; *elem_bytes = 1; return 0; }
    // Masks (an EAGLE-3 head's t2d): bytes, never computed with.
    if (!strcmp(s, "BOOL")) { *dt = KAON_U8; *elem_bytes = 1; return 0; }
    return -1;
}

static int add_tensor(kaon_safetensors *st, const st_file *f, int file_idx, const cJSON *e,
                      uint64_t data_start, uint64_t data_size) {
    const char *name = e->string ? e->string : "";
    const char *fn = f->name;
    if (!cJSON_IsObject(e))
        return kaon_set_error("%s: header entry '%s' is not an object", fn, name);
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(jd) || !jd->valuestring)
        return kaon_set_error("%s: tensor '%s' has no \"dtype\" string", fn, name);
    if (!cJSON_IsArray(js))
        return kaon_set_error("%s: tensor '%s' has no \"shape\" array", fn, name);
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2)
        return kaon_set_error("%s: tensor '%s' needs \"data_offsets\" [begin, end]", fn, name);
    kaon_dtype dt;
    int es;
    if (dtype_from_name(jd->valuestring, &dt, &es))
        return kaon_set_error("%s: tensor '%s' has dtype %.32s, which kaon does not read (F32, "
                              "F16, BF16, F8_E4M3, I32, I64)", fn, name, jd->valuestring);
    kaon_st_tensor t = {0};
    t.dtype = dt;
    int rank = cJSON_GetArraySize(js);
    if (rank > KAON_MAX_DIMS)
        return kaon_set_error("%s: tensor '%s' has %d dimensions (kaon reads at most %d)", fn,
                              name, rank, KAON_MAX_DIMS);
    t.ndim = rank;
    uint64_t numel = 1;
    int d = 0;
    for (const cJSON *x = js->child; x; x = x->next, d++) {
        uint64_t v;
        if (!json_uint(x, &v))
            return kaon_set_error("%s: tensor '%s': shape[%d] is not a non-negative integer", fn,
                                  name, d);
        if (v && numel > (uint64_t)INT64_MAX / v)
            return kaon_set_error("%s: tensor '%s': element count overflows", fn, name);
        numel *= v;
        t.shape[d] = (int64_t)v;
    }
    uint64_t b, en;
    if (!json_uint(jo->child, &b) || !json_uint(jo->child->next, &en))
        return kaon_set_error("%s: tensor '%s': data_offsets are not non-negative integers", fn,
                              name);
    if (b > en || en > data_size)
        return kaon_set_error("%s: tensor '%s': data_offsets [%llu, %llu) do not lie inside the "
                              "data section (%llu bytes)", fn, name, (unsigned long long)b,
                              (unsigned long long)en, (unsigned long long)data_size);
    if (numel > UINT64_MAX / (uint64_t)es || en - b != numel * (uint64_t)es)
        return kaon_set_error("%s: tensor '%s': data_offsets [%llu, %llu) hold %llu bytes, but "
                              "%s x %llu elements need %llu", fn, name, (unsigned long long)b,
                              (unsigned long long)en, (unsigned long long)(en - b),
                              jd->valuestring, (unsigned long long)numel,
                              (unsigned long long)(numel * (uint64_t)es));
    t.data = f->base + data_start + b;
    t.nbytes = (size_t)(en - b);
    int64_t prev = index_find(st, name);
    if (prev >= 0) {
        const st_file *pf = &st->files[st->tensor_file[prev]];
        if (pf == f) return kaon_set_error("%s: duplicate tensor '%s'", fn, name);
        return kaon_set_error("%s: tensor '%s' is also in %s", fn, name, pf->name);
    }
    if (st->n_tensors == st->cap_tensors) {
        int64_t cap = st->cap_tensors ? st->cap_tensors * 2 : 64;
        kaon_st_tensor *nt = realloc(st->tensors, (size_t)cap * sizeof *nt);
        if (nt) st->tensors = nt;
        int *nf = realloc(st->tensor_file, (size_t)cap * sizeof *nf);
        if (nf) st->tensor_file = nf;
        if (!nt || !nf) return kaon_set_error("%s: out of memory", fn);
        st->cap_tensors = cap;
    }
    t.name = strdup(name);
    if (!t.name) return kaon_set_error("%s: out of memory", fn);
    if (index_insert(st, t.name, (uint32_t)st->n_tensors)) {
        free((char *)t.name);
        return kaon_set_error("%s: out of memory", fn);
    }
    st->tensor_file[st->n_tensors] = file_idx;
    st->tensors[st->n_tensors++] = t;
    return 0;
}

// Parses the header of files[file_idx] and appends its tensors.
static int parse_file(kaon_safetensors *st, int file_idx) {
    const st_file *f = &st->files[file_idx];
    if (f->size < 8)
        return kaon_set_error("%s: too small for a safetensors file (%zu bytes)", f->name, f->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | f->base[i];
    if (n > f->size - 8)
        return kaon_set_error("%s: header length %llu runs past the end of the file (size %zu)",
                              f->name, (unsigned long long)n, f->size);
    if (n > ST_MAX_HEADER)
        return kaon_set_error("%s: header length %llu is over the %u byte limit", f->name,
                              (unsigned long long)n, ST_MAX_HEADER);
    // Parse a NUL-terminated copy: the parser then cannot stray past the header whatever it
    // does, and the copy is small next to the tensors it describes.
    char *json = malloc((size_t)n + 1);
    if (!json) return kaon_set_error("%s: out of memory for a %llu byte header", f->name,
                                     (unsigned long long)n);
    memcpy(json, f->base + 8, (size_t)n);
    json[n] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)n, &end, 0);
    if (!root) {
        size_t at = end && end >= json && end <= json + n ? (size_t)(end - json) : 0;
        free(json);
        return kaon_set_error("%s: header is not valid JSON (near byte %zu of %llu)", f->name,
                              (size_t)8 + at, (unsigned long long)n);
    }
    int rc = 0;
    // The writer pads the header with spaces; anything else after the JSON is corrupt.
    for (const char *p = end; p && p < json + n; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            rc = kaon_set_error("%s: unexpected bytes after the JSON header (at byte %zu)",
                                f->name, (size_t)(p - json) + 8);
            break;
        }
    }
    if (!rc && !cJSON_IsObject(root))
        rc = kaon_set_error("%s: header is not a JSON object", f->name);
    for (const cJSON *e = root->child; !rc && e; e = e->next) {
        if (e->string && !strcmp(e->string, "__metadata__")) continue;
        rc = add_tensor(st, f, file_idx, e, 8 + n, f->size - 8 - n);
    }
    cJSON_Delete(root);
    free(json);
    return rc;
}

static st_file *new_file(kaon_safetensors *st) {
    st_file *nf = realloc(st->files, (size_t)(st->n_files + 1) * sizeof *nf);
    if (!nf) return NULL;
    st->files = nf;
    memset(&nf[st->n_files], 0, sizeof *nf);
    return &nf[st->n_files++];
}

static int open_one(kaon_safetensors *st, const char *path) {
    st_file *f = new_file(st);
    if (!f) return kaon_set_error("%s: out of memory", path);
    if (map_file(path, f)) return -1;
    return parse_file(st, st->n_files - 1);
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool bad_shard_name(const char *s) {
    return !*s || strchr(s, '/') || strstr(s, "..");
}

static int open_index(kaon_safetensors *st, const char *dir, const char *index_path) {
    size_t len;
    char *text = kaon_read_file(index_path, ST_MAX_INDEX_JSON, &len);
    if (!text) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return kaon_set_error("%s: not valid JSON", index_path);
    int rc = 0;
    const char **seen = NULL;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        rc = kaon_set_error("%s: no \"weight_map\" object", index_path);
        goto done;
    }
    // Open every distinct shard once, in order of first mention (a hash set of names: real
    // indexes list up to ~100k tensors over a few hundred shards).
    uint64_t cap = 16;
    for (int n = cJSON_GetArraySize(map); cap < 2 * (uint64_t)n;) cap <<= 1;
    seen = calloc(cap, sizeof *seen);
    if (!seen) {
        rc = kaon_set_error("%s: out of memory", index_path);
        goto done;
    }
    for (const cJSON *e = map->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring) {
            rc = kaon_set_error("%s: weight_map entry '%s' is not a file name", index_path,
                                e->string ? e->string : "");
            goto done;
        }
        const char *shard = e->valuestring;
        if (bad_shard_name(shard)) {
            rc = kaon_set_error("%s: shard name '%.200s' (for tensor '%s') must be a plain file "
                                "name in the folder", index_path, shard, e->string);
            goto done;
        }
        uint64_t h = hash_str(shard) & (cap - 1);
        while (seen[h] && strcmp(seen[h], shard)) h = (h + 1) & (cap - 1);
        if (seen[h]) continue;
        seen[h] = shard;
        char *path = join(dir, shard);
        if (!path) {
            rc = kaon_set_error("%s: out of memory", index_path);
            goto done;
        }
        rc = open_one(st, path);
        free(path);
        if (rc) goto done;
    }
    // Every listed tensor must be in the shard named for it.
    for (const cJSON *e = map->child; e; e = e->next) {
        int64_t i = index_find(st, e->string);
        const char *shard = e->valuestring;
        const char *in = i >= 0 ? st->files[st->tensor_file[i]].name : NULL;
        const char *base = in ? strrchr(in, '/') : NULL;
        base = base ? base + 1 : in;
        if (!in || strcmp(base, shard)) {
            if (in)
                rc = kaon_set_error("%s: tensor '%s' is listed in shard '%s' but lies in %s",
                                    index_path, e->string, shard, in);
            else
                rc = kaon_set_error("%s: tensor '%s' is missing from its shard '%s'", index_path,
                                    e->string, shard);
            goto done;
        }
    }
done:
    free(seen);
    cJSON_Delete(root);
    return rc;
}

kaon_safetensors *kaon_safetensors_open(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        kaon_set_error("%s: %s", path, strerror(errno));
        return NULL;
    }
    kaon_safetensors *st = calloc(1, sizeof *st);
    if (!st) {
        kaon_set_error("%s: out of memory", path);
        return NULL;
    }
    int rc;
    if (!S_ISDIR(sb.st_mode)) {
        rc = open_one(st, path);
    } else {
        char *index = join(path, "model.safetensors.index.json");
        char *single = join(path, "model.safetensors");
        if (!index || !single) rc = kaon_set_error("%s: out of memory", path);
        else if (access(index, F_OK) == 0) rc = open_index(st, path, index);
        else if (access(single, F_OK) == 0) rc = open_one(st, single);
        else rc = kaon_set_error("%s: no model.safetensors or model.safetensors.index.json in "
                                 "this folder", path);
        free(index);
        free(single);
    }
    if (rc) {
        kaon_safetensors_close(st);
        return NULL;
    }
    return st;
}

kaon_safetensors *kaon_safetensors_open_memory(const void *data, size_t size) {
    static const uint8_t empty[1];
    kaon_safetensors *st = calloc(1, sizeof *st);
    st_file *f = st ? new_file(st) : NULL;
    if (f) f->name = strdup("<memory>");
    if (!f || !f->name) {
        kaon_safetensors_close(st);
        kaon_set_error("<memory>: out of memory");
        return NULL;
    }
    f->base = data ? data : empty;
    f->size = data ? size : 0;
    if (parse_file(st, 0)) {
        kaon_safetensors_close(st);
        return NULL;
    }
    return st;
}

void kaon_safetensors_close(kaon_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].mapped) munmap((void *)st->files[i].base, st->files[i].size);
        free(st->files[i].name);
    }
    for (int64_t i = 0; i < st->n_tensors; i++) free((char *)st->tensors[i].name);
    free(st->files);
    free(st->tensors);
    free(st->tensor_file);
    free(st->slots);
    free(st);
}

int64_t kaon_safetensors_count(const kaon_safetensors *st) { return st ? st->n_tensors : 0; }

const kaon_st_tensor *kaon_safetensors_at(const kaon_safetensors *st, int64_t i) {
    if (!st || i < 0 || i >= st->n_tensors) return NULL;
    return &st->tensors[i];
}

const kaon_st_tensor *kaon_safetensors_find(const kaon_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    int64_t i = index_find(st, name);
    return i < 0 ? NULL : &st->tensors[i];
}
