// GGUF v2/v3 reader: the whole file is mmapped, every count and offset is checked against the
// file size before use, and tensor data is handed out in place (never copied or expanded).
#ifndef KAON_IO_GGUF_H
#define KAON_IO_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum kaon_gguf_type {
    KAON_GGUF_U8 = 0, KAON_GGUF_I8 = 1, KAON_GGUF_U16 = 2, KAON_GGUF_I16 = 3,
    KAON_GGUF_U32 = 4, KAON_GGUF_I32 = 5, KAON_GGUF_F32 = 6, KAON_GGUF_BOOL = 7,
    KAON_GGUF_STRING = 8, KAON_GGUF_ARRAY = 9, KAON_GGUF_U64 = 10, KAON_GGUF_I64 = 11,
    KAON_GGUF_F64 = 12,
};

typedef struct kaon_gguf kaon_gguf;

// A string inside the mapping: not NUL-terminated.
typedef struct kaon_gguf_str {
    const char *ptr;
    uint64_t len;
} kaon_gguf_str;

typedef struct kaon_gguf_tensor {
    kaon_gguf_str name;
    uint32_t n_dims;
    uint64_t dims[4];  // GGUF order: dims[0] varies fastest (HF [out, in] is [in, out] here)
    uint32_t ggml_type;
    uint64_t offset;   // relative to the data section
    const void *data;  // in the mapping (NULL when unsized)
    uint64_t nbytes;
    bool unsized;      // (kaon_gguf_open_metadata) a ggml type whose layout kaon does not know
} kaon_gguf_tensor;

// Opens and validates a file; NULL with kaon_last_error() set on any problem.
kaon_gguf *kaon_gguf_open(const char *path);
// Opens a file for its metadata (the tokenizer, kaon info): as kaon_gguf_open, but tensors may
// have any ggml type. Those of a type kaon cannot compute with keep their size and data when
// ggml's layout of the type is known, else they are unsized (data NULL, nbytes 0).
kaon_gguf *kaon_gguf_open_metadata(const char *path);
// Parses a buffer the caller keeps alive (fuzzing, tests). The buffer is not copied.
kaon_gguf *kaon_gguf_open_memory(const void *data, size_t size);
kaon_gguf *kaon_gguf_open_memory_metadata(const void *data, size_t size);
void kaon_gguf_close(kaon_gguf *g);

uint32_t kaon_gguf_version(const kaon_gguf *g);
uint32_t kaon_gguf_alignment(const kaon_gguf *g);
size_t kaon_gguf_file_size(const kaon_gguf *g);

// Metadata. Index lookups return -1 when the key is absent.
int64_t kaon_gguf_kv_count(const kaon_gguf *g);
int64_t kaon_gguf_find_key(const kaon_gguf *g, const char *key);
kaon_gguf_str kaon_gguf_key(const kaon_gguf *g, int64_t i);
enum kaon_gguf_type kaon_gguf_kv_type(const kaon_gguf *g, int64_t i);

// Typed getters with a default when absent. Integers of any width and sign convert (range
// checked: out of range gives the default); f32/f64 convert to each other.
int64_t kaon_gguf_get_int(const kaon_gguf *g, const char *key, int64_t dflt);
double kaon_gguf_get_float(const kaon_gguf *g, const char *key, double dflt);
bool kaon_gguf_get_bool(const kaon_gguf *g, const char *key, bool dflt);
// Returns false when absent or not a string.
bool kaon_gguf_get_str(const kaon_gguf *g, const char *key, kaon_gguf_str *out);

// Arrays: element type and count; elements read by index (strings, or numbers as above).
bool kaon_gguf_get_array(const kaon_gguf *g, const char *key, enum kaon_gguf_type *elem_type,
                         uint64_t *count);
// For arrays of strings: an index of every element, built once at open (O(1) access).
kaon_gguf_str kaon_gguf_array_str(const kaon_gguf *g, const char *key, uint64_t i);
// For arrays of fixed-size numbers: a pointer to the packed little-endian elements.
const void *kaon_gguf_array_data(const kaon_gguf *g, const char *key);

// Tensors.
int64_t kaon_gguf_tensor_count(const kaon_gguf *g);
const kaon_gguf_tensor *kaon_gguf_tensor_at(const kaon_gguf *g, int64_t i);
const kaon_gguf_tensor *kaon_gguf_find_tensor(const kaon_gguf *g, const char *name);

// ggml tensor types: the name ("unknown" past the known ids), and elements and bytes per block
// (false for an unknown or removed type).
const char *kaon_gguf_type_name(uint32_t ggml_type);
bool kaon_gguf_type_block(uint32_t ggml_type, uint32_t *blck, uint32_t *size);

// Helper: compare a kaon_gguf_str with a C string.
bool kaon_gguf_str_eq(kaon_gguf_str s, const char *c);

#endif
