// Internals shared by the tokenizer's source files (not a public header).
//
// One model covers both families HF `tokenizers` builds from a BPE model:
//  - byte-level (GPT-2, Llama-3, Qwen2, SmolLM2): the BPE runs on raw bytes; each vocab
//    entry is stored decoded from the GPT-2 byte<->char map, so no text is ever mapped.
//  - char-level / SentencePiece-style (Llama-2, Mistral): the BPE runs on UTF-8 chars of the
//    normalized text ("▁" for spaces); unknown chars fall back to <0xXX> byte tokens.
// Pipeline per kaon_tokenize call, as HF: split out added tokens that match raw text ->
// normalize each gap -> split out added tokens that match normalized text -> pre-tokenizer
// steps (PCRE2 splits, prefix space, Metaspace) -> BPE per piece (word cache) -> ids.
#ifndef KAON_TOKENIZER_TOK_INTERNAL_H
#define KAON_TOKENIZER_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

// Caps that keep hostile files bounded.
#define TK_MAX_VOCAB (1 << 22)       // ids must stay below this
#define TK_MAX_TOKEN_BYTES 4096      // longest token text accepted
#define TK_MAX_STEPS 8               // pre-tokenizer steps
#define TK_MAX_NORM_OPS 8            // normalizer ops
#define TK_MAX_POST 8                // tokens added by the post-processor on each side

enum { TK_BYTE_LEVEL = 1, TK_CHAR_LEVEL = 2 };

// Token flags.
enum {
    TKF_PRESENT = 1,   // id has a text
    TKF_MODEL = 2,     // in the BPE model's vocab (can be produced by merges / char lookup)
    TKF_ADDED = 4,     // an added token (matched in text before the model runs)
    TKF_SPECIAL = 8,   // skipped by skip_special
    TKF_EOG = 16,      // ends generation
};

// String -> int32 map over texts kept in an arena (open addressing, linear probing).
typedef struct tk_strmap {
    uint32_t *slot_id;   // index+1 into the entry arrays, 0 = empty
    uint32_t mask;
    uint32_t n, cap_entries;
    uint32_t *e_off, *e_len, *e_hash;
    int32_t *e_val;
    char *arena;         // owned
    size_t arena_len, arena_cap;
} tk_strmap;

// (left id, right id) -> (rank, merged id).
typedef struct tk_pairmap {
    uint64_t *keys;
    uint32_t *rank;
    int32_t *merged;
    uint32_t mask, n;
} tk_pairmap;

// Byte trie of added tokens; leftmost-longest matching.
typedef struct tk_trie_node {
    int32_t child;    // first child, -1 none
    int32_t sibling;  // next sibling, -1 none
    int32_t added;    // index into tokenizer->added, -1 when no token ends here
    uint8_t byte;
} tk_trie_node;

typedef struct tk_trie {
    tk_trie_node *nodes;
    int32_t n, cap;
    int32_t root[256];  // child of the root per first byte, -1 none
} tk_trie;

typedef struct tk_added {
    int32_t id;
    bool lstrip, rstrip, single_word, normalized, special;
} tk_added;

enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { STEP_SPLIT, STEP_PREFIX_SPACE, STEP_METASPACE };
enum { PREPEND_NEVER, PREPEND_FIRST, PREPEND_ALWAYS };

typedef struct tk_step {
    int kind;
    pcre2_code *re;     // STEP_SPLIT
    int behavior;
    bool invert;
    int prepend;        // STEP_METASPACE
    bool split;         // STEP_METASPACE: split on the replacement, merged with next
    char repl[8];       // STEP_METASPACE replacement (UTF-8, NUL-terminated)
    int repl_len;
} tk_step;

enum { NORM_PREPEND, NORM_REPLACE };
typedef struct tk_normop {
    int kind;
    char *a;  // prepend text / pattern
    char *b;  // replacement
    size_t a_len, b_len;
} tk_normop;

// Word cache shared by threads: try-locked, never blocks; cleared when full.
typedef struct tk_cache {
    pthread_mutex_t mu;
    uint64_t *hash;      // 0 = empty slot
    uint32_t *key_off, *key_len, *ids_off, *ids_n;
    uint32_t mask, n;
    char *keys;
    size_t keys_len, keys_cap;
    int32_t *ids;
    size_t ids_len, ids_cap;
} tk_cache;

struct kaon_tokenizer {
    int kind;
    int32_t n_vocab;          // max id + 1
    uint32_t *vform_off, *vform_len;  // vocab form (NUL-terminated, in strs)
    uint32_t *dec_off, *dec_len;      // decoded bytes (in strs)
    uint8_t *flags;
    char *strs;
    size_t strs_len, strs_cap;

    tk_strmap model_map;  // model string -> id (byte-level: raw bytes; else vocab form)
    tk_strmap text_map;   // vocab form -> id, every token
    tk_pairmap pairs;
    int32_t unit_tok[256];    // byte-level: token of each byte; char-level: of each ASCII char
    int32_t byte_fb[256];     // <0xXX> tokens, -1 when absent
    bool byte_fallback;
    int32_t unk_id;           // -1 none
    bool fuse_unk;
    bool ignore_merges;

    tk_added *added;
    int32_t n_added;
    tk_trie trie_raw, trie_norm;
    bool have_raw, have_norm;

    tk_normop norm[TK_MAX_NORM_OPS];
    int n_norm;
    tk_step steps[TK_MAX_STEPS];
    int n_steps;

    // Decoder.
    bool dec_byte_level;      // GPT-2 byte map (already applied to dec_*)
    bool dec_byte_fb;         // <0xXX> tokens decode to their byte
    bool dec_meta_first;      // Metaspace decoder: first token drops every "▁"
    int dec_strip;            // Strip(" ", n, 0) after Fuse: leading spaces dropped
    bool dec_join_space;      // no decoder: tokens joined by " " (HF)
    char meta_repl[8];
    int meta_repl_len;

    int32_t post_pre[TK_MAX_POST], post_suf[TK_MAX_POST];
    int n_post_pre, n_post_suf;

    int32_t bos, eos;
    char *chat_template;

    tk_cache *cache;
};

// tokenizer.c: building blocks used by the loaders.
kaon_tokenizer *tk_new(int kind);
int tk_set_vocab_size(kaon_tokenizer *t, int32_t n);
// Sets the vocab form of id; flags are OR-ed. Fails on a duplicate id with another text.
int tk_set_token(kaon_tokenizer *t, int32_t id, const char *s, size_t len, uint8_t flags);
int tk_add_merge(kaon_tokenizer *t, int32_t l, int32_t r, uint32_t rank, int32_t merged);
int tk_add_added(kaon_tokenizer *t, int32_t id, bool special, bool normalized, bool lstrip,
                 bool rstrip, bool single_word);
// After every token, merge and added token is set: builds maps, decoded forms, tries.
int tk_finish(kaon_tokenizer *t);
int tk_strmap_get(const tk_strmap *m, const char *s, size_t len);
int tk_strmap_put(tk_strmap *m, const char *s, size_t len, int32_t val);  // keeps first
void tk_strmap_free(tk_strmap *m);
const char *tk_vform(const kaon_tokenizer *t, int32_t id, size_t *len);

// pretok.c
// Compiles an HF/onig-style pattern for PCRE2 (adapting \s to Unicode White_Space).
pcre2_code *tk_regex_compile(const char *pat, size_t len);
// Appends the steps a GGUF tokenizer.ggml.pre value stands for; -1 naming it if unknown.
int tk_steps_for_gguf_pre(kaon_tokenizer *t, const char *pre);
int tk_add_split_step(kaon_tokenizer *t, const char *pat, size_t len, int behavior, bool invert);
void tk_steps_free(kaon_tokenizer *t);
int tk_add_literal_split_step(kaon_tokenizer *t, const char *s, size_t len, int behavior, bool invert);

// encode.c: the normalizer applied to one string (malloc'd; NULL on OOM).
char *tk_normalize_alloc(const kaon_tokenizer *t, const char *s, size_t n, size_t *out_len);

// GPT-2 byte <-> unicode char map.
void tk_byte_to_char(uint8_t b, char out[3], int *len);  // UTF-8 of the char for b
int tk_char_to_byte(uint32_t cp);                       // -1 when cp is not in the map
// Decodes one UTF-8 char; returns its length (>=1) and sets *cp, or 0 when invalid
// (the caller then treats one byte as a unit).
int tk_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

#endif
