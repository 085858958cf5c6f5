// Pieces of the JSON Schema converter shared between its files (not a public interface).
#ifndef KAON_GRAMMAR_JSON_SCHEMA_INTERNAL_H
#define KAON_GRAMMAR_JSON_SCHEMA_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include <stddef.h>

#include <cjson/cJSON.h>

#include "grammar/gbnf_text.h"
#include "grammar/json_schema.h"
#include "util/err.h"

// Integers the grammars write have at most this many digits, so a model cannot loop on digits.
#define JS_MAX_INT_DIGITS 15
#define JS_MAX_INT_VALUE 999999999999999LL  // 10^15 - 1
#define JS_MAX_FRACTION_DIGITS 6

// Appends a GBNF expression (one parenthesized group) matching exactly the decimal texts of the
// integers in [lo, hi] as JSON writes them: no leading zeros, no "-0", no '+'.
// Both bounds must lie within +-JS_MAX_INT_VALUE and lo <= hi.
void js_int_range_expr(gbnf_text *out, int64_t lo, int64_t hi);

// Appends the rule `name` (helpers `name`-...) matching JSON string keys, quotes included, that
// are none of keys[0..n): no escapes, any other character. Returns the trie's node count (the
// number of helper rules) or -1 when out of memory.
int js_key_excluding(gbnf_text *out, const char *name, const char *const *keys, int n_keys);

// ---- the converter's state and helpers (json_schema.c), used by json_schema_object.c ----

// Limits on hostile schemas.
#define JS_MAX_SCHEMA_BYTES (256 * 1024)
#define JS_MAX_DEPTH 48        // schema nodes nested inside each other
#define JS_MAX_RULES 4096      // rules this converter writes (repetitions add more at parse)
#define JS_MAX_ENUM 1024       // enum members
#define JS_MAX_COUNT 1024      // minItems/maxItems/minLength/maxLength/properties
#define JS_ANY_DEPTH 8         // nesting of a free-form JSON value
#define JS_NAME 96

enum { SH_CHAR = 1, SH_STRING = 2, SH_INTEGER = 4, SH_NUMBER = 8, SH_VALUE = 16, SH_WS = 32 };

typedef struct {
    const cJSON *node;
    char name[JS_NAME];
    int struct_depth;  // objects/arrays open when its generation began
    int level;         // generations of the same target open around this one (ref_cap)
    bool done;
    bool pruned;       // its generation met the depth limit where nothing could be left out
} js_ref;

typedef struct js_body {
    uint32_t hash;
    char *text;
    char name[JS_NAME];
} js_body;

typedef struct {
    gbnf_text *out;
    char root[JS_NAME / 2];
    const cJSON *doc;
    kaon_json_schema_opts opts;
    int n_rules, depth, struct_depth;
    js_ref *refs;
    int n_refs, cap_refs;
    unsigned shared;
    char sep[JS_NAME];    // after ':' and ','
    char inner[JS_NAME + 2];  // after '{' '[', before '}' ']' ',' ':' (empty by default)
    char ptr[512];        // JSON pointer of the node being converted
    struct js_body *bodies;  // rules written so far by body text: equal bodies share one rule
    int n_bodies, cap_bodies;
    int ref_cap;          // recursive $ref nesting limit (0: none)
    int str_cap;          // characters of a string without maxLength (0: no limit)
    bool pruned;          // the last failure is the limit: the caller may leave the member out
} js_conv;

// After a failed js_schema_rule: true (and the failure forgotten) when it failed only on the
// recursion limit, so the caller may leave that member out.
bool js_take_pruned(js_conv *c);


// Sets kaon_last_error to "json schema: at #<pointer>: <message>"; returns -1.
int js_fail(js_conv *c, const char *fmt, ...) KAON_PRINTF(2, 3);
// JSON pointer segments pushed while descending; each returns the length to pop back to.
size_t js_push_ptr(js_conv *c, const char *seg);
size_t js_push_index(js_conv *c, const char *key, int i);
void js_pop_ptr(js_conv *c, size_t old);
int js_new_name(js_conv *c, char *name);  // a fresh helper rule name (JS_NAME bytes)
// Writes `name ::= body`; a body written before under another name becomes `name ::= that`
// (a tail reference: the matcher's stacks, and so the mask caches, are shared).
int js_emit_rule(js_conv *c, const char *name, const gbnf_text *body);
// The rule written before with exactly this body, or NULL.
const char *js_same_body(const js_conv *c, const char *text);
void js_bodies_free(js_conv *c);
const char *js_shared(js_conv *c, unsigned which);  // name of a shared rule (SH_*), emitted once
const cJSON *js_get(const cJSON *s, const char *key);
bool js_in_list(const char *const *list, const char *s);
extern const char *const js_annotations[];  // keywords that constrain nothing
const char *js_other_constraint(const cJSON *s, const char *except);
long js_count_keyword(const cJSON *s, const char *key, long dflt);  // -2 when malformed
int js_key_literal(js_conv *c, const char *key, gbnf_text *body);
const cJSON *js_resolve_ref(js_conv *c, const char *ref);
int js_schema_rule(js_conv *c, const cJSON *s, char *name);  // a rule for a schema node
// Bodies of object and array schemas, and of an allOf of object schemas (json_schema_object.c).
int js_object_body(js_conv *c, const cJSON *s, gbnf_text *b);
int js_array_body(js_conv *c, const cJSON *s, gbnf_text *b);
int js_allof_objects(js_conv *c, const cJSON *list, gbnf_text *b);

#endif
