// The architectures kaon runs: one entry per architecture file, and those plugins add at run
// time (model/plugin.c).
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "model/arch.h"
#include "util/err.h"

extern const kaon_arch_ops kaon_arch_llama;
extern const kaon_arch_ops kaon_arch_gemma3;
extern const kaon_arch_ops kaon_arch_deepseek2;
extern const kaon_arch_ops kaon_arch_gptoss;

// Built in: fixed at compile time, never locked.
static const kaon_arch_ops *const builtin[] = {&kaon_arch_llama, &kaon_arch_gemma3, &kaon_arch_deepseek2,
                                               &kaon_arch_gptoss};
#define N_BUILTIN (sizeof builtin / sizeof builtin[0])

// Added at run time (plugins, model/plugin.c): append-only, so a pointer found stays valid; the
// mutex orders a registration against lookups on other threads.
#define MAX_ADDED 64
static const kaon_arch_ops *added[MAX_ADDED];
static int n_added;
static pthread_mutex_t added_mu = PTHREAD_MUTEX_INITIALIZER;

// The architecture at index i of the whole list (built-ins first); NULL past its end. Call
// with added_mu held.
static const kaon_arch_ops *arch_at(size_t i) {
    if (i < N_BUILTIN) return builtin[i];
    i -= N_BUILTIN;
    return i < (size_t)n_added ? added[i] : NULL;
}

static const kaon_arch_ops *find_locked(const char *name, kaon_arch *variant) {
    const kaon_arch_ops *a;
    for (size_t i = 0; name && (a = arch_at(i)); i++)
        for (const kaon_arch_name *n = a->names; n->name; n++)
            if (!strcmp(n->name, name)) {
                if (variant) *variant = n->variant;
                return a;
            }
    return NULL;
}

const char *kaon_arch_supported(void) {
    static _Thread_local char list[2048];  // rebuilt per call: plugins may have added names
    size_t at = 0;
    list[0] = 0;
    pthread_mutex_lock(&added_mu);
    const kaon_arch_ops *a;
    for (size_t i = 0; (a = arch_at(i)); i++)
        for (const kaon_arch_name *n = a->names; n->name; n++)
            at += (size_t)snprintf(list + at, at < sizeof list ? sizeof list - at : 0, "%s%s",
                                   at ? ", " : "", n->name);
    pthread_mutex_unlock(&added_mu);
    return list;
}

const kaon_arch_ops *kaon_arch_find(const char *name, kaon_arch *variant) {
    pthread_mutex_lock(&added_mu);
    const kaon_arch_ops *a = find_locked(name, variant);
    pthread_mutex_unlock(&added_mu);
    if (a) return a;
    if (variant) *variant = KAON_ARCH_UNKNOWN;
    kaon_set_error("unsupported architecture '%s' (kaon knows: %s)", name && *name ? name : "(none given)",
                   kaon_arch_supported());
    return NULL;
}

// What every registered architecture must have for the loader and the runner to use it.
static int check_ops(const kaon_arch_ops *a) {
    if (!a || !a->label || !a->names || !a->names[0].name)
        return kaon_set_error("an architecture needs a label and at least one name");
    if (!a->forward || !a->weights || a->n_weights <= 0 || !a->globals_size || !a->layer_size)
        return kaon_set_error("architecture '%s' needs a forward pass, a weight table and its struct sizes", a->label);
    for (const kaon_arch_name *n = a->names; n->name; n++) {
        if (!*n->name || strlen(n->name) >= sizeof ((kaon_model_config *)0)->arch_name)
            return kaon_set_error("architecture '%s': name '%s' is empty or too long", a->label, n->name);
        if (n->variant == KAON_ARCH_UNKNOWN)
            return kaon_set_error("architecture '%s': name '%s' has no variant (KAON_ARCH_PLUGIN?)", a->label, n->name);
    }
    return 0;
}

// The first name of a that is taken (by a registered architecture, one of list[0..n), or an
// earlier name of a itself), its owner in *owner; NULL when all are new. Call with added_mu held.
static const char *clash(const kaon_arch_ops *a, const kaon_arch_ops *const *list, int n, const kaon_arch_ops **owner) {
    for (const kaon_arch_name *nm = a->names; nm->name; nm++) {
        const kaon_arch_ops *o = find_locked(nm->name, NULL);
        for (int i = 0; !o && i < n; i++)
            for (const kaon_arch_name *m = list[i]->names; !o && m->name; m++)
                if (!strcmp(m->name, nm->name)) o = list[i];
        for (const kaon_arch_name *m = a->names; !o && m != nm; m++)
            if (!strcmp(m->name, nm->name)) o = a;
        if (o) {
            *owner = o;
            return nm->name;
        }
    }
    return NULL;
}

int kaon_arch_check_new(const kaon_arch_ops *a, const kaon_arch_ops *const *pending, int n_pending) {
    if (check_ops(a)) return -1;
    pthread_mutex_lock(&added_mu);
    const kaon_arch_ops *owner = NULL;
    const char *dup = clash(a, pending, n_pending, &owner);
    pthread_mutex_unlock(&added_mu);
    if (dup) return kaon_set_error("architecture '%s' is already registered (by '%s')", dup, owner->label);
    return 0;
}

int kaon_arch_register(const kaon_arch_ops *const *ops, int n) {
    pthread_mutex_lock(&added_mu);
    int rc = 0;
    if (n_added + n > MAX_ADDED) rc = kaon_set_error("too many plugin architectures (at most %d)", MAX_ADDED);
    for (int i = 0; !rc && i < n; i++) {
        const kaon_arch_ops *owner = NULL;
        const char *dup = NULL;
        if (check_ops(ops[i])) rc = -1;
        else if ((dup = clash(ops[i], ops, i, &owner)))
            rc = kaon_set_error("architecture '%s' is already registered (by '%s')", dup, owner->label);
    }
    for (int i = 0; !rc && i < n; i++) added[n_added++] = ops[i];  // all or none
    pthread_mutex_unlock(&added_mu);
    return rc;
}

kaon_arch kaon_arch_from_name(const char *name) {
    kaon_arch v = KAON_ARCH_UNKNOWN;
    kaon_arch_find(name, &v);
    return v;
}

const char *kaon_arch_label(kaon_arch a) {
    switch (a) {
    case KAON_ARCH_LLAMA: return "llama";
    case KAON_ARCH_QWEN2: return "qwen2";
    case KAON_ARCH_QWEN3: return "qwen3";
    case KAON_ARCH_GEMMA3: return "gemma3";
    case KAON_ARCH_DEEPSEEK2: return "deepseek2";
    case KAON_ARCH_DEEPSEEK3: return "deepseek3";
    case KAON_ARCH_GPTOSS: return "gpt-oss";
    case KAON_ARCH_PLUGIN: return "plugin";
    default: return "unknown";
    }
}
