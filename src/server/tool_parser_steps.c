// The tool-call parsers' state machine (tool_parser.h): a state per place in each family's
// format. Every step either consumes bytes whose meaning is settled or waits for more; none looks
// at where the chunks were cut. The text is kept whole so that an attempt that fails (text that
// began like a call but is not one) can be given back as content.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/tool_parser_internal.h"

typedef struct marker {
    const char *text;
    int state;
} marker;

static const marker hermes_markers[] = {{"<tool_call>", S_OBJ}};
static const marker llama_markers[] = {{"<|python_tag|>", S_OBJ}};
static const marker mistral_markers[] = {{"[TOOL_CALLS]", S_MISTRAL_OPEN}};
static const marker deepseek_markers[] = {{DS_CALLS_BEGIN, S_DS_SECTION}};
static const marker kimi_markers[] = {{"<|tool_calls_section_begin|>", S_KIMI_SECTION},
                                      {"<|tool_call_section_begin|>", S_KIMI_SECTION}};

static const marker *family_markers(kaon_tool_family f, int *n) {
    switch (f) {
    case KAON_TOOL_HERMES: *n = 1; return hermes_markers;
    case KAON_TOOL_LLAMA3_JSON: *n = 1; return llama_markers;
    case KAON_TOOL_MISTRAL: *n = 1; return mistral_markers;
    case KAON_TOOL_DEEPSEEK_V3: *n = 1; return deepseek_markers;
    case KAON_TOOL_KIMI_K2: *n = 2; return kimi_markers;
    default: *n = 0; return NULL;
    }
}


// ---- primitives ------------------------------------------------------------------------------

static const char *at(const kaon_tool_parser *p) { return p->buf.data + p->pos; }
static size_t avail(const kaon_tool_parser *p) { return p->buf.len - p->pos; }

static void emit(kaon_tool_parser *p, size_t from, size_t to) {
    if (to > from && kaon_sbuf_append(p->out, p->buf.data + from, to - from) < 0) p->oom = true;
}

static void skip_ws(kaon_tool_parser *p) {
    while (p->pos < p->buf.len && kaon_json_is_ws(p->buf.data[p->pos])) p->pos++;
}

// 1: a byte is there; 0: wait for more; -1: the output ended.
static int want(const kaon_tool_parser *p) { return avail(p) ? 1 : p->final ? -1 : 0; }

// Consumes lit when the text continues with it. 1: matched; 0: wait (what is there is a prefix of
// it); -1: no.
static int match(kaon_tool_parser *p, const char *lit) {
    size_t n = strlen(lit), k = avail(p) < n ? avail(p) : n;
    if (memcmp(at(p), lit, k)) return -1;
    if (k < n) return p->final ? -1 : 0;
    p->pos += n;
    return 1;
}

// Characters of a function name (and of Kimi's "functions.NAME:IDX" ids).
static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-' || c == '.' || c == ':' || c == '/';
}

// Name characters up to end_marker: 1 with the name (malloc'd) in *out and the marker consumed;
// 0: wait; -1: something else comes first, or no name.
static int read_name_until(kaon_tool_parser *p, const char *end_marker, char **out) {
    size_t n = strlen(end_marker);
    for (size_t i = p->pos; i < p->buf.len; i++) {
        size_t left = p->buf.len - i;
        if (!memcmp(p->buf.data + i, end_marker, left < n ? left : n)) {
            if (left < n) return p->final ? -1 : 0;
            if (i == p->pos || i - p->pos > 256) return -1;
            *out = strndup(at(p), i - p->pos);
            if (!*out) {
                p->oom = true;
                return -1;
            }
            p->pos = i + n;
            return 1;
        }
        if (!name_char(p->buf.data[i]) || i - p->pos > 256) return -1;
    }
    return p->final ? -1 : 0;
}

// A whole JSON string at pos (the opening quote) into *out, decoded.
static int read_string(kaon_tool_parser *p, char **out) {
    size_t end = 0;
    int r = kaon_json_string_end(at(p), avail(p), &end);
    if (r == 0) return p->final || avail(p) > 65536 ? -1 : 0;
    if (r < 0) return -1;
    *out = kaon_json_unescape(at(p), end);
    if (!*out) return -1;
    p->pos += end;
    return 1;
}

static int commit(kaon_tool_parser *p, char *name, char *id) {
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 4;
        tool_call *c = realloc(p->calls, sizeof *c * (size_t)cap);
        if (!c) goto oom;
        p->calls = c;
        p->cap = cap;
    }
    if (!id) {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "%d", p->n);
        size_t a = strlen(p->id_prefix), b = strlen(tmp);
        id = malloc(a + b + 1);
        if (!id) goto oom;
        memcpy(id, p->id_prefix, a);
        memcpy(id + a, tmp, b + 1);
    }
    p->calls[p->n++] = (tool_call){.id = id, .name = name};
    p->committed = true;
    return 0;
oom:
    free(name);
    free(id);
    p->oom = true;
    return -1;
}

static tool_call *current(kaon_tool_parser *p) { return &p->calls[p->n - 1]; }

static void append_args(kaon_tool_parser *p, size_t from, size_t to) {
    if (to > from && kaon_sbuf_append(&current(p)->args, p->buf.data + from, to - from) < 0)
        p->oom = true;
}

// The attempt is not a call after all: its text so far is content, unless a call was already
// made from it (then only what follows is).
static int fail(kaon_tool_parser *p) {
    if (!p->committed) emit(p, p->attempt, p->pos);
    p->after_call = p->committed;
    p->state = S_TEXT;
    return 1;
}

static int to_text_after_call(kaon_tool_parser *p) {
    p->after_call = true;
    p->state = S_TEXT;
    return 1;
}

static void begin_attempt(kaon_tool_parser *p, size_t start, int state) {
    p->attempt = start;
    p->committed = false;
    p->state = state;
    p->j = J_OPEN;
}

// ---- content ---------------------------------------------------------------------------------

static int step_text(kaon_tool_parser *p) {
    if (p->after_call) {  // whitespace between and after calls is not content
        skip_ws(p);
        if (!avail(p)) return 0;
        p->after_call = false;
    }
    if (p->at_start) {  // Llama: a call may also be a bare JSON object opening the output
        size_t i = p->pos;
        while (i < p->buf.len && kaon_json_is_ws(p->buf.data[i])) i++;
        if (i == p->buf.len && !p->final) return 0;
        p->at_start = false;
        if (i < p->buf.len && p->buf.data[i] == '{') {
            begin_attempt(p, p->pos, S_OBJ);
            p->pos = i;
            return 1;
        }
    }
    int nm;
    const marker *m = family_markers(p->fam, &nm);
    const char *best = NULL;
    int best_i = -1;
    for (int k = 0; k < nm; k++) {
        const char *f = memmem(at(p), avail(p), m[k].text, strlen(m[k].text));
        if (f && (!best || f < best)) best = f, best_i = k;
    }
    if (best) {
        size_t start = (size_t)(best - p->buf.data);
        emit(p, p->pos, start);
        p->pos = start + strlen(m[best_i].text);
        begin_attempt(p, start, m[best_i].state);
        return 1;
    }
    // Hold back the longest tail that could still grow into a marker.
    size_t keep = 0;
    for (int k = 0; k < nm && !p->final; k++) {
        size_t ml = strlen(m[k].text);
        for (size_t t = ml - 1 < avail(p) ? ml - 1 : avail(p); t > keep; t--)
            if (!memcmp(p->buf.data + p->buf.len - t, m[k].text, t)) {
                keep = t;
                break;
            }
    }
    emit(p, p->pos, p->buf.len - keep);
    p->pos = p->buf.len - keep;
    return 0;
}

// ---- arguments -------------------------------------------------------------------------------

static int step_args_start(kaon_tool_parser *p) {
    skip_ws(p);
    int w = want(p);
    if (w <= 0) {
        if (w == 0) return 0;
        free(p->pending_name), free(p->pending_id);
        p->pending_name = p->pending_id = NULL;
        return fail(p);
    }
    if (*at(p) != '{' && *at(p) != '[') {
        free(p->pending_name), free(p->pending_id);
        p->pending_name = p->pending_id = NULL;
        return fail(p);
    }
    char *name = p->pending_name, *id = p->pending_id;
    p->pending_name = p->pending_id = NULL;
    if (commit(p, name, id) < 0) return 0;
    memset(&p->v, 0, sizeof p->v);
    p->state = S_ARGS;
    return 1;
}

static int step_args(kaon_tool_parser *p) {
    size_t from = p->pos;
    int r = kaon_json_scan_step(&p->v, p->buf.data, p->buf.len, &p->pos, p->final);
    append_args(p, from, p->pos);
    if (r == 0 && !p->final) return 0;
    // Ended, or cut short by the end of the output: the call keeps what it has.
    p->state = p->after;
    return 1;
}

// ---- JSON call objects (Hermes, Llama, Mistral's list) ---------------------------------------

static bool is_args_key(const char *k) { return !strcmp(k, "arguments") || !strcmp(k, "parameters"); }

static int obj_end(kaon_tool_parser *p) {
    if (!p->obj_committed) {
        if (!p->pending_name || !p->have_args) return fail(p);  // e.g. a JSON answer with a "name"
        char *name = p->pending_name;
        p->pending_name = NULL;
        if (commit(p, name, NULL) < 0) return 0;
        append_args(p, p->args_from, p->args_to);
    }
    p->state = p->after_obj;
    return 1;
}

static int step_obj(kaon_tool_parser *p) {
    int w, r;
    if (p->j != J_SKIP) {
        skip_ws(p);
        w = want(p);
        if (w == 0) return 0;
        if (w < 0) return fail(p);
    }
    char c = *at(p);
    switch (p->j) {
    case J_OPEN:
        if (c != '{') return fail(p);
        p->pos++;
        free(p->pending_name);
        p->pending_name = NULL;
        p->obj_committed = p->have_args = false;
        p->j = J_KEY;
        return 1;
    case J_KEY:
        if (c == '}') {  // an empty object, or a trailing comma
            p->pos++;
            return obj_end(p);
        }
        if (c != '"') return fail(p);
        free(p->key);
        p->key = NULL;
        r = read_string(p, &p->key);
        if (r <= 0) return r == 0 ? 0 : fail(p);
        p->j = J_COLON;
        return 1;
    case J_COLON:
        if (c != ':') return fail(p);
        p->pos++;
        p->j = J_VALUE;
        return 1;
    case J_VALUE:
        if (!strcmp(p->key, "name") && !p->pending_name && !p->obj_committed) {
            if (c != '"') return fail(p);
            char *name = NULL;
            r = read_string(p, &name);
            if (r <= 0) return r == 0 ? 0 : fail(p);
            p->pending_name = name;
            p->j = J_NEXT;
            if (p->have_args) {  // the arguments came first: the call is whole now
                p->pending_name = NULL;
                if (commit(p, name, NULL) < 0) return 0;
                append_args(p, p->args_from, p->args_to);
                p->obj_committed = true;
            }
            return 1;
        }
        if (is_args_key(p->key) && !p->obj_committed && p->pending_name) {
            p->obj_committed = true;
            p->after = S_OBJ;
            p->j = J_NEXT;
            p->state = S_ARGS_START;
            return 1;
        }
        p->skip_is_args = is_args_key(p->key) && !p->obj_committed && !p->have_args;
        p->skip_from = p->pos;
        memset(&p->v, 0, sizeof p->v);
        p->j = J_SKIP;
        return 1;
    case J_SKIP:
        r = kaon_json_scan_step(&p->v, p->buf.data, p->buf.len, &p->pos, p->final);
        if (r < 0 || (r == 0 && p->final)) return fail(p);
        if (r == 0) return 0;
        if (p->skip_is_args) {
            if (p->v.kind != '{') return fail(p);
            p->have_args = true;
            p->args_from = p->skip_from;
            p->args_to = p->pos;
        }
        p->j = J_NEXT;
        return 1;
    case J_NEXT:
        if (c == ',') {
            p->pos++;
            free(p->key);
            p->key = NULL;
            p->j = J_KEY;
            return 1;
        }
        if (c == '}') {
            p->pos++;
            free(p->key);
            p->key = NULL;
            return obj_end(p);
        }
        return fail(p);
    }
    return fail(p);
}

// ---- the families' frames --------------------------------------------------------------------

// After a call object: the next one after sep (or '{' for Llama), close (Mistral's ']') or not.
static int step_next_obj(kaon_tool_parser *p, char sep, char close) {
    skip_ws(p);
    int w = want(p);
    if (w == 0) return 0;
    if (w < 0) return to_text_after_call(p);
    char c = *at(p);
    if (c == sep || (close == 0 && c == '{')) {
        begin_attempt(p, p->pos, S_OBJ);
        if (c == sep) p->pos++;
        return 1;
    }
    if (close && c == close) {
        p->pos++;
        return to_text_after_call(p);
    }
    return close ? fail(p) : to_text_after_call(p);
}

// Expects lit (after whitespace), then goes to next.
static int step_expect(kaon_tool_parser *p, const char *lit, int next) {
    skip_ws(p);
    int r = match(p, lit);
    if (r == 0) return 0;
    if (r < 0) return fail(p);
    p->state = next;
    if (next == S_TEXT) p->after_call = true;
    return 1;
}

// Either a call begins (call_begin) or the section ends (one of ends).
static int step_section(kaon_tool_parser *p, const char *call_begin, int head_state,
                        const char *const *ends, int n_ends) {
    skip_ws(p);
    int r = match(p, call_begin), waiting = r == 0;
    if (r > 0) {
        p->state = head_state;
        return 1;
    }
    for (int i = 0; i < n_ends; i++) {
        r = match(p, ends[i]);
        if (r > 0) return to_text_after_call(p);
        waiting |= r == 0;
    }
    return waiting ? 0 : fail(p);
}

static int step_named(kaon_tool_parser *p, const char *end_marker, int next) {
    char *name = NULL;
    int r = read_name_until(p, end_marker, &name);
    if (r == 0) return 0;
    if (r < 0) return fail(p);
    free(p->pending_name);
    p->pending_name = name;
    p->state = next;
    return 1;
}

int kaon_tool_parser_step(kaon_tool_parser *p) {
    static const char *const ds_ends[] = {DS_CALLS_END};
    static const char *const kimi_ends[] = {"<|tool_calls_section_end|>",
                                            "<|tool_call_section_end|>"};
    switch (p->state) {
    case S_TEXT: return step_text(p);
    case S_OBJ: return step_obj(p);
    case S_ARGS_START: return step_args_start(p);
    case S_ARGS: return step_args(p);
    case S_HERMES_END: return step_expect(p, "</tool_call>", S_TEXT);
    case S_LLAMA_NEXT: return step_next_obj(p, ';', 0);
    case S_MISTRAL_NEXT: return step_next_obj(p, ',', ']');
    case S_MISTRAL_OPEN: {
        skip_ws(p);
        int w = want(p);
        if (w <= 0) return w == 0 ? 0 : fail(p);
        if (*at(p) == '[') {
            p->pos++;
            p->state = S_OBJ;
            p->j = J_OPEN;
        } else {
            p->state = S_MISTRAL_NAME;
        }
        return 1;
    }
    case S_MISTRAL_NAME:
        p->after = S_CALL_DONE;  // after the arguments: content, or the next [TOOL_CALLS]
        return step_named(p, "[ARGS]", S_ARGS_START);
    case S_DS_SECTION: return step_section(p, DS_CALL_BEGIN, S_DS_HEAD, ds_ends, 1);
    case S_DS_HEAD: return step_named(p, DS_SEP, S_DS_AFTER_SEP);
    case S_DS_AFTER_SEP: {
        skip_ws(p);
        int w = want(p);
        if (w <= 0) return w == 0 ? 0 : fail(p);
        p->after = S_DS_CALL_END;
        if (!strcmp(p->pending_name, "function") && *at(p) != '{') {
            p->state = S_DS_NAME;  // V3: the type, then the name on its own line
        } else {
            p->state = S_ARGS_START;  // V3.1: the name, then the arguments
        }
        return 1;
    }
    case S_DS_NAME: return step_named(p, "\n", S_DS_FENCE);
    case S_DS_FENCE:
        p->after = S_DS_FENCE_END;
        return step_expect(p, "```json", S_ARGS_START);
    case S_DS_FENCE_END: return step_expect(p, "```", S_DS_CALL_END);
    case S_DS_CALL_END: return step_expect(p, DS_CALL_END, S_DS_SECTION);
    case S_KIMI_SECTION: return step_section(p, "<|tool_call_begin|>", S_KIMI_HEAD, kimi_ends, 2);
    case S_KIMI_HEAD: {
        skip_ws(p);
        char *id = NULL;
        int r = read_name_until(p, "<|tool_call_argument_begin|>", &id);
        if (r == 0) return 0;
        if (r < 0) return fail(p);
        // functions.NAME:IDX -> NAME; the whole string stays the call's id.
        const char *s = !strncmp(id, "functions.", 10) ? id + 10 : id;
        const char *colon = strrchr(s, ':');
        free(p->pending_name);
        free(p->pending_id);
        p->pending_name = strndup(s, colon && colon > s ? (size_t)(colon - s) : strlen(s));
        p->pending_id = id;
        if (!p->pending_name) p->oom = true;
        p->after = S_KIMI_CALL_END;
        p->state = S_ARGS_START;
        return 1;
    }
    case S_KIMI_CALL_END: return step_expect(p, "<|tool_call_end|>", S_KIMI_SECTION);
    case S_CALL_DONE: return to_text_after_call(p);
    }
    return 0;
}
