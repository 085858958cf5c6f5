// safetensors reader tests: files built in memory (dtypes, shapes, metadata, every class of bad
// header, every truncation of a valid file) and folders on disk (single file, sharded index,
// bad indexes).
//
// `test_safetensors --dump PATH` prints what the reader sees as JSON lines (a count line, then
// one line per tensor); tests/ref/test_io_files.py compares it with the safetensors package.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "test.h"
#include "util/err.h"

typedef struct buf {
    uint8_t *p;
    size_t n;
} buf;

// u64 header length | header (space padded to 8 bytes) | data
static buf st_build(const char *header, const uint8_t *data, size_t n_data) {
    size_t h = strlen(header), hp = (h + 7) / 8 * 8;
    buf b = {malloc(8 + hp + n_data + 1), 8 + hp + n_data};
    for (int i = 0; i < 8; i++) b.p[i] = (uint8_t)((uint64_t)hp >> (8 * i));
    memcpy(b.p + 8, header, h);
    memset(b.p + 8 + h, ' ', hp - h);
    if (n_data) memcpy(b.p + 8 + hp, data, n_data);
    return b;
}

static uint8_t pattern[4096];

static buf st_build_pattern(const char *header, size_t n_data) {
    return st_build(header, pattern, n_data);
}

static kaon_safetensors *open_copy(const uint8_t *p, size_t n, uint8_t **keep) {
    *keep = malloc(n ? n : 1);
    if (n) memcpy(*keep, p, n);
    kaon_clear_error();
    return kaon_safetensors_open_memory(*keep, n);
}

static void expect_fail(const buf *b, const char *needle, int line) {
    uint8_t *keep;
    kaon_safetensors *st = open_copy(b->p, b->n, &keep);
    if (st) {
        fprintf(stderr, "line %d: expected failure (%s), but it opened\n", line, needle);
        kaon_test_failures++;
        kaon_safetensors_close(st);
    } else if (!strstr(kaon_last_error(), needle)) {
        fprintf(stderr, "line %d: error '%s' lacks '%s'\n", line, kaon_last_error(), needle);
        kaon_test_failures++;
    }
    free(keep);
}
#define EXPECT_FAIL_HDR(header, n_data, needle)                \
    do {                                                       \
        buf _b = st_build_pattern((header), (n_data));         \
        expect_fail(&_b, (needle), __LINE__);                  \
        free(_b.p);                                            \
    } while (0)

static const char *valid_header =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"b.half\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[24,32]},"
    "\"scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[32,36]},"
    "\"empty\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[36,36]},"
    "\"c\":{\"dtype\":\"BF16\",\"shape\":[2,1,2,1],\"data_offsets\":[36,44]}}";
#define VALID_DATA 44

static void test_valid(void) {
    buf b = st_build_pattern(valid_header, VALID_DATA);
    uint8_t *keep;
    kaon_safetensors *st = open_copy(b.p, b.n, &keep);
    CHECK(st != NULL);
    if (!st) {
        fprintf(stderr, "%s\n", kaon_last_error());
        free(keep);
        free(b.p);
        return;
    }
    const uint8_t *data0 = keep + (b.n - VALID_DATA);
    CHECK(kaon_safetensors_count(st) == 5);
    const kaon_st_tensor *t = kaon_safetensors_find(st, "a");
    CHECK(t && t->dtype == KAON_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
    CHECK(t && t->data == data0 && t->nbytes == 24);
    CHECK(t == kaon_safetensors_at(st, 0));
    t = kaon_safetensors_find(st, "b.half");
    CHECK(t && t->dtype == KAON_F16 && t->ndim == 1 && t->shape[0] == 4);
    CHECK(t && t->data == data0 + 24 && t->nbytes == 8);
    CHECK(t && !memcmp(t->data, pattern + 24, 8));
    t = kaon_safetensors_find(st, "scalar");
    CHECK(t && t->ndim == 0 && t->nbytes == 4 && t->data == data0 + 32);
    t = kaon_safetensors_find(st, "empty");
    CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 5 && t->nbytes == 0);
    t = kaon_safetensors_find(st, "c");
    CHECK(t && t->dtype == KAON_BF16 && t->ndim == 4 && t->shape[2] == 2 && t->nbytes == 8);
    CHECK(t && strcmp(t->name, "c") == 0);
    CHECK(kaon_safetensors_find(st, "__metadata__") == NULL);
    CHECK(kaon_safetensors_find(st, "missing") == NULL);
    CHECK(kaon_safetensors_at(st, 5) == NULL && kaon_safetensors_at(st, -1) == NULL);
    kaon_safetensors_close(st);
    free(keep);

    // Every proper prefix fails cleanly.
    size_t fails = 0;
    for (size_t n = 0; n < b.n; n++) {
        kaon_safetensors *s2 = open_copy(b.p, n, &keep);
        if (s2) {
            fprintf(stderr, "prefix %zu/%zu opened\n", n, b.n);
            kaon_safetensors_close(s2);
        } else if (strstr(kaon_last_error(), "<memory>")) {
            fails++;
        }
        free(keep);
    }
    CHECK(fails == b.n);
    free(b.p);

    // Empty header object: a file with no tensors is valid.
    b = st_build_pattern("{}", 0);
    st = open_copy(b.p, b.n, &keep);
    CHECK(st != NULL && kaon_safetensors_count(st) == 0);
    kaon_safetensors_close(st);
    free(keep);
    free(b.p);
}

static void test_bad(void) {
    buf b = {malloc(4), 4};
    memset(b.p, 0, 4);
    expect_fail(&b, "too small for a safetensors file", __LINE__);
    free(b.p);
    b = st_build_pattern("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    b.p[0] = 0xff;
    b.p[3] = 0x01;
    expect_fail(&b, "header length 16777471 runs past the end of the file", __LINE__);
    b.p[7] = 0xff;
    expect_fail(&b, "runs past the end of the file", __LINE__);
    free(b.p);
    EXPECT_FAIL_HDR("{\"a\":{\"dtype\":\"F32\",", 0, "header is not valid JSON");
    EXPECT_FAIL_HDR("", 0, "header is not valid JSON");
    EXPECT_FAIL_HDR("[1,2]", 0, "header is not a JSON object");
    EXPECT_FAIL_HDR("{} x", 0, "unexpected bytes after the JSON header");
    EXPECT_FAIL_HDR("{\"a\":3}", 0, "header entry 'a' is not an object");
    EXPECT_FAIL_HDR("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                    "tensor 'a' has no \"dtype\" string");
    EXPECT_FAIL_HDR("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
                    "tensor 'a' has no \"shape\" array");
    EXPECT_FAIL_HDR("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "needs \"data_offsets\"");
    EXPECT_FAIL_HDR("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
                    "needs \"data_offsets\"");
    EXPECT_FAIL_HDR("{\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"I16\",\"shape\":[4],"
                    "\"data_offsets\":[0,8]}}", 8,
                    "tensor 'model.layers.0.self_attn.q_proj.weight' has dtype I16");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,5]}}", 5,
                    "hold 5 bytes, but I8 x 4 elements need 4");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F8_E5M2\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
                    "tensor 'w' has dtype F8_E5M2, which kaon does not read");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,5]}}", 5,
                    "hold 5 bytes, but F8_E4M3 x 4 elements need 4");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"U64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                    "has dtype U64");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                    "hold 8 bytes, but I32 x 3 elements need 12");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                    "tensor 'w' has 5 dimensions");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                    "shape[0] is not a non-negative integer");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
                    "shape[0] is not a non-negative integer");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4,
                    "shape[0] is not a non-negative integer");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                    "\"data_offsets\":[0,4]}}", 4, "element count overflows");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
                    "\"data_offsets\":[0,4]}}", 4, "shape[0] is not a non-negative integer");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 4,
                    "tensor 'w': data_offsets [0, 8) do not lie inside the data section (4 bytes)");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
                    "do not lie inside");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8,
                    "tensor 'w': data_offsets [0, 4) hold 4 bytes, but F32 x 2 elements need 8");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 8,
                    "data_offsets are not non-negative integers");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", 8,
                    "data_offsets are not non-negative integers");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                    "duplicate tensor 'w'");
    EXPECT_FAIL_HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e400]}}", 8,
                    "data_offsets are not non-negative integers");
}

// ---- folders on disk -----------------------------------------------------------------------

static void write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) abort();
    fclose(f);
}

static void write_st(const char *dir, const char *name, const char *header, size_t n_data) {
    buf b = st_build_pattern(header, n_data);
    write_file(dir, name, b.p, b.n);
    free(b.p);
}

static void write_text(const char *dir, const char *name, const char *text) {
    write_file(dir, name, text, strlen(text));
}

static void rm_dir(const char *dir) {
    static const char *names[] = {"model.safetensors", "model.safetensors.index.json",
                                  "model-00001-of-00002.safetensors",
                                  "model-00002-of-00002.safetensors"};
    char path[512];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void expect_open_fail(const char *path, const char *needle, int line) {
    kaon_clear_error();
    kaon_safetensors *st = kaon_safetensors_open(path);
    if (st) {
        fprintf(stderr, "line %d: expected failure (%s), but %s opened\n", line, needle, path);
        kaon_test_failures++;
        kaon_safetensors_close(st);
    } else if (!strstr(kaon_last_error(), needle)) {
        fprintf(stderr, "line %d: error '%s' lacks '%s'\n", line, kaon_last_error(), needle);
        kaon_test_failures++;
    }
}

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

static void test_folders(void) {
    char dir[] = "/tmp/kaon_st_test_XXXXXX";
    if (!mkdtemp(dir)) abort();

    expect_open_fail(dir, "no model.safetensors or model.safetensors.index.json", __LINE__);
    CHECK(strstr(kaon_last_error(), dir) != NULL);

    // Single model.safetensors in the folder, also opened directly as a file.
    write_st(dir, "model.safetensors", valid_header, VALID_DATA);
    kaon_safetensors *st = kaon_safetensors_open(dir);
    CHECK(st && kaon_safetensors_count(st) == 5);
    kaon_safetensors_close(st);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st = kaon_safetensors_open(path);
    CHECK(st && kaon_safetensors_find(st, "c") != NULL);
    kaon_safetensors_close(st);
    unlink(path);

    // Two shards and an index (which wins over a stray model.safetensors).
    write_st(dir, SHARD1,
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"y\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[8,12]}}", 12);
    write_st(dir, SHARD2, "{\"z\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]}}", 6);
    write_text(dir, "model.safetensors.index.json",
               "{\"metadata\":{\"total_size\":18},\"weight_map\":{\"x\":\"" SHARD1 "\",\"z\":\""
               SHARD2 "\",\"y\":\"" SHARD1 "\"}}");
    st = kaon_safetensors_open(dir);
    CHECK(st && kaon_safetensors_count(st) == 3);
    const kaon_st_tensor *z = kaon_safetensors_find(st, "z");
    CHECK(z && z->dtype == KAON_BF16 && z->shape[0] == 3 && !memcmp(z->data, pattern, 6));
    const kaon_st_tensor *y = kaon_safetensors_find(st, "y");
    CHECK(y && y->dtype == KAON_F16 && !memcmp(y->data, pattern + 8, 4));
    kaon_safetensors_close(st);

    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"" SHARD1 "\",\"w\":\"" SHARD2 "\"}}");
    expect_open_fail(dir, "tensor 'w' is missing from its shard '" SHARD2 "'", __LINE__);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"" SHARD1 "\",\"z\":\"" SHARD1 "\"}}");
    expect_open_fail(dir, "tensor 'z' is missing from its shard '" SHARD1 "'", __LINE__);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"" SHARD1 "\",\"y\":\"" SHARD2 "\",\"z\":\"" SHARD2
               "\"}}");
    expect_open_fail(dir, "tensor 'y' is listed in shard '" SHARD2 "' but lies in", __LINE__);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"x\":\"../etc/passwd\"}}");
    expect_open_fail(dir, "must be a plain file name", __LINE__);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"x\":\"..\"}}");
    expect_open_fail(dir, "must be a plain file name", __LINE__);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"x\":\"/abs\"}}");
    expect_open_fail(dir, "must be a plain file name", __LINE__);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"x\":7}}");
    expect_open_fail(dir, "weight_map entry 'x' is not a file name", __LINE__);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"x\":\"nope.safetensors\"}}");
    expect_open_fail(dir, "nope.safetensors: cannot open", __LINE__);
    write_text(dir, "model.safetensors.index.json", "{\"metadata\":{}}");
    expect_open_fail(dir, "no \"weight_map\" object", __LINE__);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":");
    expect_open_fail(dir, "model.safetensors.index.json: not valid JSON", __LINE__);
    // A tensor present in two shards.
    write_st(dir, SHARD2, "{\"x\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]}}", 6);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"" SHARD1 "\",\"y\":\"" SHARD2 "\"}}");
    expect_open_fail(dir, "tensor 'x' is also in", __LINE__);
    // A corrupt shard header names the shard file.
    static const char corrupt[] = "\x10\0\0\0\0\0\0\0{not json at all";
    write_file(dir, SHARD2, corrupt, sizeof corrupt - 1);
    expect_open_fail(dir, SHARD2 ": header", __LINE__);

    expect_open_fail("/nonexistent/dir", "/nonexistent/dir: No such file", __LINE__);
    rm_dir(dir);
}

// ---- dump mode -----------------------------------------------------------------------------

static int dump(const char *path) {
    kaon_safetensors *st = kaon_safetensors_open(path);
    if (!st) {
        fprintf(stderr, "error: %s\n", kaon_last_error());
        return 2;
    }
    printf("{\"count\": %lld}\n", (long long)kaon_safetensors_count(st));
    for (int64_t i = 0; i < kaon_safetensors_count(st); i++) {
        const kaon_st_tensor *t = kaon_safetensors_at(st, i);
        uint64_t h = 1469598103934665603ull;  // FNV-1a 64 of the data bytes
        for (size_t j = 0; j < t->nbytes; j++) h = (h ^ ((const uint8_t *)t->data)[j]) * 1099511628211ull;
        printf("{\"tensor\": \"");
        for (const char *c = t->name; *c; c++) {
            if (*c == '"' || *c == '\\') printf("\\%c", *c);
            else if ((unsigned char)*c < 0x20) printf("\\u%04x", *c);
            else putchar(*c);
        }
        printf("\", \"dtype\": \"%s\", \"shape\": [", kaon_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) printf(d ? ", %lld" : "%lld", (long long)t->shape[d]);
        printf("], \"nbytes\": %zu, \"fnv1a\": \"%016llx\", \"found\": %s}\n", t->nbytes,
               (unsigned long long)h, kaon_safetensors_find(st, t->name) == t ? "true" : "false");
    }
    kaon_safetensors_close(st);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--dump")) return dump(argv[2]);
    for (size_t i = 0; i < sizeof pattern; i++) pattern[i] = (uint8_t)(i * 13 + 5);
    test_valid();
    test_bad();
    test_folders();
    TEST_MAIN_END();
}
