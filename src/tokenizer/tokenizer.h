// Text <-> token ids, exactly as Hugging Face `tokenizers` does it: byte-level BPE (GPT-2
// family) and SentencePiece-style BPE (byte fallback), special tokens matched first.
#ifndef KAON_TOKENIZER_TOKENIZER_H
#define KAON_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/gguf.h"

typedef struct kaon_tokenizer kaon_tokenizer;

// From GGUF metadata (tokenizer.ggml.*). NULL + kaon_last_error() on failure.
kaon_tokenizer *kaon_tokenizer_from_gguf(const kaon_gguf *g);
// From a folder with tokenizer.json (+ tokenizer_config.json when present).
kaon_tokenizer *kaon_tokenizer_from_hf_dir(const char *dir);
// From tokenizer.json text (+ optional tokenizer_config.json text, may be NULL). Fuzzable.
kaon_tokenizer *kaon_tokenizer_from_hf_json(const char *tokenizer_json, size_t len,
                                            const char *config_json, size_t config_len);
void kaon_tokenizer_free(kaon_tokenizer *t);

int kaon_tokenizer_vocab_size(const kaon_tokenizer *t);
int kaon_tokenizer_bos(const kaon_tokenizer *t);  // -1 when none
int kaon_tokenizer_eos(const kaon_tokenizer *t);  // -1 when none
bool kaon_tokenizer_is_special(const kaon_tokenizer *t, int id);
// End-of-generation tokens (eos, <|im_end|>, <|eot_id|>, ...).
bool kaon_tokenizer_is_eog(const kaon_tokenizer *t, int id);
// The raw text of a token (byte-level tokens decoded to bytes); NULL when out of range.
const char *kaon_tokenizer_token_text(const kaon_tokenizer *t, int id, size_t *len);
int kaon_tokenizer_find_token(const kaon_tokenizer *t, const char *text);  // -1 if absent
// Chat template from the file (NULL when the model has none) and the strings of bos/eos.
const char *kaon_tokenizer_chat_template(const kaon_tokenizer *t);
const char *kaon_tokenizer_bos_text(const kaon_tokenizer *t);
const char *kaon_tokenizer_eos_text(const kaon_tokenizer *t);

// Encodes text (any bytes; invalid UTF-8 handled as HF does). add_special: add BOS/EOS as
// the tokenizer's post-processor / add_bos_token says. *ids is malloc'd; caller frees.
int kaon_tokenize(const kaon_tokenizer *t, const char *text, size_t len, bool add_special,
                  int32_t **ids, size_t *n_ids);
// One-shot decode; *text is malloc'd and NUL-terminated.
int kaon_detokenize(const kaon_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                    char **text, size_t *len);

// Incremental decode for streaming: push ids one by one; emits only complete UTF-8, and the
// concatenation of everything emitted (plus a final flush) equals kaon_detokenize's result.
typedef struct kaon_detok kaon_detok;
kaon_detok *kaon_detok_new(const kaon_tokenizer *t, bool skip_special);
// Appends the newly completed text to *out (malloc'd, may be empty); returns its length or -1.
int kaon_detok_push(kaon_detok *d, int32_t id, char **out, size_t *len);
int kaon_detok_flush(kaon_detok *d, char **out, size_t *len);
void kaon_detok_free(kaon_detok *d);

#endif
