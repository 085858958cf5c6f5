#include "io/json_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/err.h"

char *kaon_read_file(const char *path, size_t limit, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        kaon_set_error("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(fp);
        kaon_set_error("%s: not a regular file", path);
        return NULL;
    }
    // Read in chunks rather than trusting st_size (the file may change under us).
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            size_t want = cap ? cap * 2 : 65536;
            if (want > limit + 1) want = limit + 1;
            char *nb = realloc(buf, want + 1);
            if (!nb) {
                free(buf);
                fclose(fp);
                kaon_set_error("%s: out of memory", path);
                return NULL;
            }
            buf = nb;
            cap = want;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0 || n > limit) break;
    }
    int err = ferror(fp);
    fclose(fp);
    if (err || n > limit) {
        free(buf);
        if (err) kaon_set_error("%s: read error", path);
        else kaon_set_error("%s: larger than %zu bytes", path, limit);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

const char *kaon_json_type_name(const cJSON *j) {
    if (!j) return "nothing";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsBool(j)) return "bool";
    if (cJSON_IsNumber(j)) return "number";
    if (cJSON_IsString(j)) return "string";
    if (cJSON_IsArray(j)) return "array";
    if (cJSON_IsObject(j)) return "object";
    return "invalid";
}

cJSON *kaon_json_field(const cJSON *obj, const char *key) {
    cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return it && !cJSON_IsNull(it) ? it : NULL;
}
