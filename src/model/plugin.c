// Loading plugins (include/kaon_plugin.h): dlopen, check the descriptor, let the plugin register
// its architectures, and keep the library loaded for the life of the process (its ops live in
// it). Every refusal is one error line that starts "plugin PATH: ".
#include "model/plugin.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kaon.h"
#include "kaon_plugin.h"
#include "model/hf_json.h"
#include "util/log.h"

#define MAX_PLUGINS 32
#define MAX_PENDING 16

// One load at a time: the register call fills `pending`, which joins the registry only when
// the call succeeds (a plugin's architectures come all together or not at all).
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static void *loaded[MAX_PLUGINS];  // handles kept open: registered ops point into them
static int n_loaded;
static bool registering;
static const kaon_arch_ops *pending[MAX_PENDING];
static int n_pending;

static int host_register_arch(const kaon_arch_ops *ops) {
    if (!registering) return kaon_set_error("register_arch is only valid during a plugin's register call");
    if (n_pending == MAX_PENDING) return kaon_set_error("a plugin registers at most %d architectures", MAX_PENDING);
    if (kaon_arch_check_new(ops, pending, n_pending)) return -1;
    pending[n_pending++] = ops;
    return 0;
}

static void host_log(int level, const char *fmt, ...) {
    if (level < KAON_LOG_DEBUG || level > KAON_LOG_ERROR) level = KAON_LOG_INFO;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kaon_log((enum kaon_log_level)level, "%s", msg);
}

static int host_set_error(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kaon_set_error("%s", msg);
}

static const kaon_plugin_host host = {
    .api_version = KAON_PLUGIN_API_VERSION,
    .size = sizeof(kaon_plugin_host),
    .register_arch = host_register_arch,
    .log = host_log,
    .set_error = host_set_error,
    .hf_get_int = kaon_hf_get_int,
    .hf_get_float = kaon_hf_get_float,
    .hf_get_bool = kaon_hf_get_bool,
    .build_rope = kaon_model_build_rope,
    .blk_embed = kaon_blk_embed,
    .blk_scale_x = kaon_blk_scale_x,
    .blk_norm = kaon_blk_norm,
    .blk_qkv = kaon_blk_qkv,
    .blk_attention = kaon_blk_attention,
    .blk_out = kaon_blk_out,
    .blk_mlp = kaon_blk_mlp,
    .blk_llama_layer = kaon_blk_llama_layer,
    .blk_logits = kaon_blk_logits,
};

#define LAYOUT_NAME_(t) #t,
static const char *const layout_names[] = {KAON_PLUGIN_LAYOUT(LAYOUT_NAME_)};
static const uint32_t layout_sizes[] = KAON_PLUGIN_LAYOUT_SIZES;

// The error left by the plugin's call, prefixed with which plugin it was. Always -1.
static int prefix_error(const char *path, const char *name) {
    char why[1024];
    snprintf(why, sizeof why, "%s", kaon_last_error());  // set_error reads its arguments from the same buffer
    return kaon_set_error("plugin %s (%s): %s", path, name, why);
}

// 0 when d was built for this kaon; else -1 + the reason.
static int check_desc(const char *path, const kaon_plugin_desc *d) {
    if (!d) return kaon_set_error("plugin %s: %s() returned no descriptor", path, KAON_PLUGIN_ENTRY_SYMBOL);
    if (d->magic != KAON_PLUGIN_MAGIC)
        return kaon_set_error("plugin %s: bad magic 0x%08x in its descriptor (not a kaon plugin)", path, d->magic);
    if (d->api_version != KAON_PLUGIN_API_VERSION)
        return kaon_set_error("plugin %s: built for plugin API %u, this kaon has %d (rebuild the plugin "
                              "against this kaon)", path, d->api_version, KAON_PLUGIN_API_VERSION);
    if (d->n_layout != KAON_PLUGIN_N_LAYOUT)
        return kaon_set_error("plugin %s: its layout fingerprint has %u structs, this kaon's %d (rebuild the "
                              "plugin against this kaon)", path, d->n_layout, KAON_PLUGIN_N_LAYOUT);
    for (int i = 0; i < KAON_PLUGIN_N_LAYOUT; i++)
        if (d->layout[i] != layout_sizes[i])
            return kaon_set_error("plugin %s: built against other kaon headers (sizeof(%s) is %u there, %u "
                                  "here; rebuild the plugin against this kaon)", path, layout_names[i],
                                  d->layout[i], layout_sizes[i]);
    if (!d->register_fn) return kaon_set_error("plugin %s: its descriptor has no register function", path);
    return 0;
}

// Opens, checks and registers; the caller holds load_mu. 0 or -1 + error.
static int load_locked(const char *path) {
    if (access(path, F_OK)) return kaon_set_error("plugin %s: no such file", path);
    // dlopen reads a bare name as a library to search for: a path is meant here.
    char local[4096];
    snprintf(local, sizeof local, "%s%s", strchr(path, '/') ? "" : "./", path);
    void *h = dlopen(local, RTLD_NOW | RTLD_LOCAL);
    if (!h) return kaon_set_error("plugin %s: cannot load: %s", path, dlerror());
    for (int i = 0; i < n_loaded; i++)
        if (loaded[i] == h) {  // loaded before (--plugin and KAON_PLUGINS both name it): nothing to do
            dlclose(h);
            return 0;
        }
    int rc = -1;
    kaon_plugin_entry_fn entry = NULL;
    *(void **)&entry = dlsym(h, KAON_PLUGIN_ENTRY_SYMBOL);  // POSIX's way to get a function pointer
    if (!entry) {
        kaon_set_error("plugin %s: no %s symbol (not a kaon plugin)", path, KAON_PLUGIN_ENTRY_SYMBOL);
    } else if (n_loaded == MAX_PLUGINS) {
        kaon_set_error("plugin %s: too many plugins (at most %d)", path, MAX_PLUGINS);
    } else {
        const kaon_plugin_desc *d = entry();
        if (!check_desc(path, d)) {
            const char *name = d->name ? d->name : "?";
            registering = true;
            n_pending = 0;
            kaon_set_error("its register function failed");  // what a plugin that sets none gets
            int r = d->register_fn(&host);
            registering = false;
            if (r) prefix_error(path, name);
            else if (n_pending == 0) kaon_set_error("plugin %s (%s): registered no architecture", path, name);
            else if (kaon_arch_register(pending, n_pending)) prefix_error(path, name);
            else {
                loaded[n_loaded++] = h;
                kaon_log(KAON_LOG_DEBUG, "plugin %s (%s): %d architecture(s)", path, name, n_pending);
                rc = 0;
            }
            n_pending = 0;
        }
    }
    if (rc) dlclose(h);
    return rc;
}

int kaon_plugin_load(const char *path) {
    if (!path || !*path) return kaon_set_error("plugin: empty path");
    pthread_mutex_lock(&load_mu);
    int rc = load_locked(path);
    pthread_mutex_unlock(&load_mu);
    return rc;
}

int kaon_plugin_load_list(const char *paths) {
    for (const char *p = paths; p && *p;) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n >= 4096) return kaon_set_error("plugin path too long in KAON_PLUGINS");
        char one[4096];
        memcpy(one, p, n);
        one[n] = 0;
        if (n && kaon_plugin_load(one)) return -1;  // empty entries (a::b) are skipped
        p = end ? end + 1 : p + n;
    }
    return 0;
}
