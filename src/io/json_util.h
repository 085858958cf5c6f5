// Small helpers shared by the JSON readers (safetensors index, config.json, API requests).
#ifndef KAON_IO_JSON_UTIL_H
#define KAON_IO_JSON_UTIL_H

#include <stddef.h>

#include <cjson/cJSON.h>

// Reads a whole file of at most `limit` bytes, NUL-terminated; NULL + kaon error on failure.
char *kaon_read_file(const char *path, size_t limit, size_t *len);
// "string", "number", ... for messages about wrong types.
const char *kaon_json_type_name(const cJSON *j);
// obj[key], or NULL when absent or JSON null (OpenAI and Anthropic treat null as left out).
cJSON *kaon_json_field(const cJSON *obj, const char *key);

#endif
