// Typed reads of config.json keys, for the common parser (hf_config.c) and the architecture
// files' own keys. A key holding JSON null counts as absent; a key of the wrong type, or a
// number that does not fit, is an error naming the file and the key (prefix + key).
#ifndef KAON_MODEL_HF_JSON_H
#define KAON_MODEL_HF_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

const cJSON *kaon_hf_field(const cJSON *obj, const char *key);  // NULL when absent or null
int kaon_hf_type_error(const char *file, const char *prefix, const char *key, const char *want,
                       const cJSON *got);
// Each: 0 (absent leaves *out alone; *set tells whether it was there), or -1 + error.
int kaon_hf_get_int(const char *file, const cJSON *obj, const char *prefix, const char *key,
                    int *out, bool *set);
int kaon_hf_get_float(const char *file, const cJSON *obj, const char *prefix, const char *key,
                      float *out, bool *set);
int kaon_hf_get_bool(const char *file, const cJSON *obj, const char *key, bool *out);
int kaon_hf_get_str(const char *file, const cJSON *obj, const char *key, char *dst, size_t cap,
                    bool *set);

#endif
