#include "cli/cli.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "backend/device.h"
#include "engine/spec.h"
#include "util/err.h"
#include "util/cpus.h"
#include "util/log.h"

static bool file_exists(const char *p) { return access(p, R_OK) == 0; }

const char *kaon_cli_default_model(void) {
    static char path[PATH_MAX + 64];
    const char *env = getenv("KAON_MODEL");
    if (env && *env) return env;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(path, sizeof path, "%s/../models/%s", exe, KAON_DEFAULT_MODEL_FILE);
            if (file_exists(path)) return path;
        }
    }
    snprintf(path, sizeof path, "models/%s", KAON_DEFAULT_MODEL_FILE);
    if (file_exists(path)) return path;
    return NULL;
}

bool kaon_cli_is_gguf(const char *path) {
    FILE *f = path ? fopen(path, "rb") : NULL;
    char magic[4] = {0};
    const bool yes = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (f) fclose(f);
    return yes;
}

int kaon_cli_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("kaon: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

bool kaon_cli_parse_int(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool kaon_cli_parse_float(const char *s, double lo, double hi, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

int kaon_cli_parse_ids(const char *s, int32_t **ids, int *n) {
    int cap = 16, cnt = 0;
    int32_t *a = malloc(sizeof *a * (size_t)cap);
    if (!a) return -1;
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '[' || *p == ']') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            free(a);
            return -1;
        }
        if (cnt == cap) {
            cap *= 2;
            int32_t *b = realloc(a, sizeof *a * (size_t)cap);
            if (!b) { free(a); return -1; }
            a = b;
        }
        a[cnt++] = (int32_t)v;
        p = end;
    }
    *ids = a;
    *n = cnt;
    return 0;
}

int kaon_cli_default_threads(void) { return kaon_default_threads(); }

int kaon_cli_check_device(const char *v, bool allow_noop) {
    kaon_device d;
    if (kaon_device_parse(v, &d) || (d.kind == KAON_DEVICE_NOOP && !allow_noop))
        return kaon_cli_fail("bad --device '%s' (%s%s)", v, KAON_DEVICE_FORMS, allow_noop ? ", noop" : "");
    return 0;
}

int kaon_cli_check_kv_dtype(const char *v) {
    static const char *const ok[] = {"auto", "bf16", "fp8", "fp8_e4m3"};
    for (size_t i = 0; v && i < sizeof ok / sizeof ok[0]; i++)
        if (!strcmp(v, ok[i])) return 0;
    return kaon_cli_fail("bad --kv-cache-dtype '%s' (auto, bf16, fp8 or fp8_e4m3)", v ? v : "");
}

int kaon_cli_parse_spec_config(const char *json, kaon_speculative_options *o) {
    static char method[32], oracle[4096], model[4096];  // the options point here for the life of the process
    cJSON *j = json ? cJSON_Parse(json) : NULL;
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return kaon_cli_fail("bad --speculative-config: not a JSON object (e.g. '{\"method\": \"ngram\", "
                             "\"num_speculative_tokens\": 4}')");
    }
    memset(o, 0, sizeof *o);
    int rc = 0;
    for (cJSON *f = j->child; f && !rc; f = f->next) {
        const char *k = f->string;
        int *dst = !strcmp(k, "num_speculative_tokens") ? &o->num_speculative_tokens
                 : !strcmp(k, "prompt_lookup_min")    ? &o->prompt_lookup_min
                 : !strcmp(k, "prompt_lookup_max")    ? &o->prompt_lookup_max
                 : !strcmp(k, "disable_by_batch_size") ? &o->disable_by_batch_size
                                                       : NULL;
        if (!strcmp(k, "oracle_file")) {
            if (!cJSON_IsString(f) || strlen(f->valuestring) >= sizeof oracle)
                rc = kaon_cli_fail("bad --speculative-config: \"oracle_file\" must be a path");
            else o->oracle_file = strcpy(oracle, f->valuestring);
        } else if (!strcmp(k, "model")) {
            if (!cJSON_IsString(f) || strlen(f->valuestring) >= sizeof model)
                rc = kaon_cli_fail("bad --speculative-config: \"model\" must be a path");
            else o->model = strcpy(model, f->valuestring);
        } else if (!strcmp(k, "force_accept")) {
            if (!cJSON_IsBool(f)) rc = kaon_cli_fail("bad --speculative-config: \"force_accept\" must be true or false");
            else o->force_accept = cJSON_IsTrue(f);
        } else if (!strcmp(k, "method")) {
            if (!cJSON_IsString(f) || strlen(f->valuestring) >= sizeof method)
                rc = kaon_cli_fail("bad --speculative-config: \"method\" must be a string (ngram, mtp, eagle3)");
            else o->method = strcpy(method, f->valuestring);
        } else if (dst) {
            if (!cJSON_IsNumber(f) || f->valuedouble != (double)(int)f->valuedouble)
                rc = kaon_cli_fail("bad --speculative-config: \"%s\" must be an integer", k);
            else *dst = (int)f->valuedouble;
        } else {
            rc = kaon_cli_fail("bad --speculative-config: unknown key \"%s\" (method, num_speculative_tokens, "
                               "prompt_lookup_min, prompt_lookup_max, disable_by_batch_size, oracle_file, model, force_accept)", k);
        }
    }
    cJSON_Delete(j);
    if (rc) return rc;
    if (!o->method) return kaon_cli_fail("bad --speculative-config: \"method\" is missing (ngram, mtp, eagle3)");
    kaon_spec_config c;
    rc = kaon_spec_config_resolve(o, &c) ? kaon_cli_fail("bad --speculative-config: %s", kaon_last_error()) : 0;
    kaon_spec_config_free(&c);
    return rc;
}

void kaon_cli_quiet_logs(void) {
    if (!getenv("KAON_LOG")) kaon_log_set_level(KAON_LOG_WARN);
}
