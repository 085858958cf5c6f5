#include "server/json_scan.h"

#include <stdlib.h>
#include <string.h>

int kaon_json_scan_step(kaon_json_scan *v, const char *s, size_t len, size_t *pos, bool final) {
    size_t i = *pos;
    if (!v->kind) {
        if (i >= len) return final ? -1 : 0;
        char c = s[i];
        if (c == '{' || c == '[') {
            v->kind = '{';
        } else if (c == '"') {
            v->kind = '"';
            v->in_str = true;
            i++;
        } else if (c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n') {
            v->kind = 'a';
        } else {
            return -1;
        }
    }
    if (v->kind == 'a') {
        while (i < len && s[i] && (strchr("+-.eE", s[i]) || (s[i] >= '0' && s[i] <= '9') ||
                                   (s[i] >= 'a' && s[i] <= 'z')))
            i++;
        *pos = i;
        return i < len || final ? 1 : 0;
    }
    for (; i < len; i++) {
        char c = s[i];
        if (v->in_str) {
            if (v->esc)
                v->esc = false;
            else if (c == '\\')
                v->esc = true;
            else if (c == '"') {
                v->in_str = false;
                if (v->kind == '"') {
                    *pos = i + 1;
                    return 1;
                }
            }
            continue;
        }
        if (c == '"') {
            v->in_str = true;
        } else if (c == '{' || c == '[') {
            v->depth++;
        } else if (c == '}' || c == ']') {
            if (--v->depth <= 0) {
                *pos = i + 1;
                return 1;
            }
        }
    }
    *pos = i;
    return 0;
}

int kaon_json_string_end(const char *s, size_t n, size_t *end) {
    bool esc = false;
    for (size_t i = 1; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20) return -1;
        if (esc)
            esc = false;
        else if (c == '\\')
            esc = true;
        else if (c == '"') {
            *end = i + 1;
            return 1;
        }
    }
    return 0;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

char *kaon_json_unescape(const char *s, size_t n) {
    if (n < 2 || s[0] != '"' || s[n - 1] != '"') return NULL;
    char *out = malloc(n), *o = out;  // decoding never grows the text
    if (!out) return NULL;
    for (size_t i = 1; i + 1 < n; i++) {
        char c = s[i];
        if (c != '\\') {
            *o++ = c;
            continue;
        }
        if (++i + 1 >= n) goto bad;
        switch (s[i]) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (i + 5 > n - 1 || hex4(s + i + 1, &cp)) goto bad;
            i += 4;
            if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
                if (i + 7 > n - 1 || s[i + 1] != '\\' || s[i + 2] != 'u' || hex4(s + i + 3, &lo) ||
                    lo < 0xDC00 || lo >= 0xE000)
                    goto bad;
                i += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp < 0xE000) {
                goto bad;
            }
            if (cp == 0) goto bad;
            o += put_utf8(o, cp);
            break;
        }
        default: goto bad;
        }
    }
    *o = 0;
    return out;
bad:
    free(out);
    return NULL;
}
