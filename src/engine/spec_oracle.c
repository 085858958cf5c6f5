// The oracle proposer (benchmarks only): outputs recorded earlier (greedy, same model) replayed
// as drafts, so every draft is accepted and the verify path's own cost can be measured at a
// chosen acceptance length.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/spec.h"
#include "util/err.h"

typedef struct oracle_entry {
    int32_t *prompt, *out;
    int n_prompt, n_out;
} oracle_entry;

struct kaon_spec_oracle {
    oracle_entry *e;
    int n;
};

static void oracle_free(kaon_spec_oracle *o) {
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        free(o->e[i].prompt);
        free(o->e[i].out);
    }
    free(o->e);
    free(o);
}

static int32_t *ids_of(const cJSON *a, int *n) {
    if (!cJSON_IsArray(a)) return NULL;
    *n = cJSON_GetArraySize(a);
    int32_t *v = malloc(sizeof(int32_t) * (size_t)(*n > 0 ? *n : 1));
    if (!v) return NULL;
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        if (!cJSON_IsNumber(x)) {
            free(v);
            return NULL;
        }
        v[i++] = (int32_t)x->valuedouble;
    }
    return v;
}

static kaon_spec_oracle *oracle_load(const char *path) {
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) {
        kaon_set_error("speculative decoding: cannot read oracle_file '%s'", path ? path : "(none)");
        return NULL;
    }
    kaon_spec_oracle *o = calloc(1, sizeof *o);
    char *line = NULL;
    size_t cap = 0;
    int cap_e = 0, lineno = 0, bad = 0;
    while (o && !bad && getline(&line, &cap, f) > 0) {
        lineno++;
        cJSON *j = cJSON_Parse(line);
        if (!j) {
            bad = lineno;
            break;
        }
        if (o->n == cap_e) {
            cap_e = cap_e ? 2 * cap_e : 64;
            oracle_entry *e = realloc(o->e, sizeof *e * (size_t)cap_e);
            if (!e) {
                cJSON_Delete(j);
                bad = lineno;
                break;
            }
            o->e = e;
        }
        oracle_entry *e = &o->e[o->n];
        memset(e, 0, sizeof *e);
        e->prompt = ids_of(cJSON_GetObjectItemCaseSensitive(j, "prompt_ids"), &e->n_prompt);
        e->out = ids_of(cJSON_GetObjectItemCaseSensitive(j, "token_ids"), &e->n_out);
        cJSON_Delete(j);
        o->n++;
        if (!e->prompt || !e->out) bad = lineno;
    }
    free(line);
    fclose(f);
    if (!o || bad) {
        oracle_free(o);
        kaon_set_error("speculative decoding: oracle_file '%s' line %d: want {\"prompt_ids\": [...], \"token_ids\": [...]}",
                       path, bad);
        return NULL;
    }
    return o;
}

int kaon_spec_oracle_propose(const kaon_spec_oracle *o, const int32_t *toks, int n_prompt, int n, int k,
                             int32_t *out) {
    for (int i = 0; o && i < o->n; i++) {
        const oracle_entry *e = &o->e[i];
        const int done = n - n_prompt;
        if (e->n_prompt != n_prompt || done > e->n_out || memcmp(e->prompt, toks, sizeof(int32_t) * (size_t)n_prompt) ||
            memcmp(e->out, toks + n_prompt, sizeof(int32_t) * (size_t)done))
            continue;
        int m = e->n_out - done < k ? e->n_out - done : k;
        memcpy(out, e->out + done, sizeof(int32_t) * (size_t)(m > 0 ? m : 0));
        return m > 0 ? m : 0;
    }
    return 0;
}

int kaon_spec_oracle_attach(kaon_spec_config *c, const char *path) {
    c->oracle = oracle_load(path);
    return c->oracle ? 0 : -1;
}

void kaon_spec_config_free(kaon_spec_config *c) {
    oracle_free(c->oracle);
    c->oracle = NULL;
}
