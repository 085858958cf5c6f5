// kaon chat: an interactive conversation in the terminal, rendered with the model's chat
// template. Each turn is one engine request for the whole conversation; the engine's prefix
// cache keeps the conversation's blocks, so a turn computes only its new tokens.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/load.h"
#include "kaon.h"
#include "server/sse.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"
#include "util/timer.h"

static void usage(void) {
    printf("usage: kaon chat [-m MODEL] [--system TEXT] [-n MAX_TOKENS_PER_TURN] [--temp T]\n"
           "                 [--top-k K] [--top-p P] [--min-p P] [--seed S] [--threads N] [--ctx-size N]\n"
           "                 [--device cpu|cuda|cuda:N] [--kv-cache-dtype auto|bf16|fp8]\n"
           "sampling defaults as in kaon serve: the model's generation_config.json, else OpenAI's\n"
           "type a message and Enter; /reset starts over, /exit (or Ctrl-D) quits\n");
}

typedef struct chat {
    kaon_engine *e;
    const kaon_tokenizer *tok;
    kaon_chat_template *tmpl;
    cJSON *messages;
    int max_model_len;
} chat;

static int render(chat *c, int32_t **ids, size_t *n) {
    cJSON *ctx = cJSON_CreateObject();
    cJSON_AddItemReferenceToObject(ctx, "messages", c->messages);
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", 1);
    const char *bos = kaon_tokenizer_bos_text(c->tok), *eos = kaon_tokenizer_eos_text(c->tok);
    cJSON_AddStringToObject(ctx, "bos_token", bos ? bos : "");
    cJSON_AddStringToObject(ctx, "eos_token", eos ? eos : "");
    char *text = NULL;
    size_t len = 0;
    int rc = kaon_chat_template_render(c->tmpl, ctx, &text, &len);
    cJSON_Delete(ctx);
    if (rc) return kaon_set_error("chat template: %s", kaon_last_error());
    // The template writes the special tokens itself, so nothing more is added here.
    rc = kaon_tokenize(c->tok, text, len, false, ids, n);
    free(text);
    return rc;
}

static void add_message(chat *c, const char *role, const char *content) {
    cJSON *msg = cJSON_CreateObject();
    cJSON_AddStringToObject(msg, "role", role);
    cJSON_AddStringToObject(msg, "content", content);
    cJSON_AddItemToArray(c->messages, msg);
}

// Runs one assistant turn; streams it to stdout and returns its text (malloc'd), NULL on error.
static char *turn(chat *c, const kaon_sampling *defaults, int max_new) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (render(c, &ids, &n)) {
        kaon_cli_fail("%s", kaon_last_error());
        return NULL;
    }
    if ((int)n >= c->max_model_len) {
        kaon_cli_fail("the conversation (%zu tokens) no longer fits the context (%d); /reset to start over",
                      n, c->max_model_len);
        free(ids);
        return NULL;
    }
    kaon_sampling sp = *defaults;
    int room = c->max_model_len - (int)n;
    sp.max_tokens = max_new < room ? max_new : room;
    double t0 = kaon_now(), t_first = 0;
    kaon_request *r = kaon_engine_submit(c->e, ids, (int)n, &sp);
    free(ids);
    if (!r) {
        kaon_cli_fail("%s", kaon_last_error());
        return NULL;
    }
    kaon_sbuf answer = {0};
    kaon_output out;
    int produced = 0, computed = (int)n;
    bool failed = false;
    while (kaon_request_next(r, &out, -1) == 1) {
        if (out.n_tokens > 0 && t_first == 0) t_first = t0 + out.first_token_time;
        produced += out.n_tokens;
        computed = out.prompt_tokens - out.cached_tokens;
        if (out.text_len) {
            fwrite(out.text, 1, out.text_len, stdout);
            fflush(stdout);
            kaon_sbuf_append(&answer, out.text, out.text_len);
        }
        if (out.finish == KAON_FINISH_ERROR) {
            kaon_cli_fail("%s", out.error ? out.error : "generation failed");
            failed = true;
        }
        if (out.finished) break;
    }
    kaon_request_free(r);
    double t2 = kaon_now();
    if (t_first == 0) t_first = t2;
    fprintf(stderr, "\n[%d prompt tokens in %.2f s, %d tokens at %.1f tok/s]\n", computed, t_first - t0,
            produced, produced > 1 ? (produced - 1) / (t2 - t_first) : 0.0);
    if (failed || answer.failed) {
        kaon_sbuf_free(&answer);
        return NULL;
    }
    return answer.data ? answer.data : strdup("");
}

static bool vocab_has(const char *text, void *tok) {
    return kaon_tokenizer_find_token(tok, text) >= 0;
}

int kaon_cmd_chat(int argc, char **argv) {
    const char *model = NULL, *system = NULL, *device = NULL, *kv_dtype = NULL;
    long max_new = 512, threads = kaon_cli_default_threads(), ctx = 4096;
    // The user's sampling flags, applied over the engine's defaults once it is loaded.
    double temp = -1, top_p = -1, min_p = -1;
    long top_k = -1, seed = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        double d;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
        if (!v) return kaon_cli_fail("option %s needs a value", a);
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--system")) system = v;
        else if (!strcmp(a, "-n") && kaon_cli_parse_int(v, 1, 1 << 20, &l)) max_new = l;
        else if (!strcmp(a, "--temp") && kaon_cli_parse_float(v, 0, 100, &d)) temp = d;
        else if (!strcmp(a, "--top-k") && kaon_cli_parse_int(v, 0, 1 << 24, &l)) top_k = l;
        else if (!strcmp(a, "--top-p") && kaon_cli_parse_float(v, 0.000001, 1, &d)) top_p = d;
        else if (!strcmp(a, "--min-p") && kaon_cli_parse_float(v, 0, 1, &d)) min_p = d;
        else if (!strcmp(a, "--seed") && kaon_cli_parse_int(v, 0, 0x7fffffffffffffffL, &l)) seed = l;
        else if (!strcmp(a, "--threads") && kaon_cli_parse_int(v, 1, 1024, &l)) threads = l;
        else if (!strcmp(a, "--ctx-size") && kaon_cli_parse_int(v, 64, 1 << 24, &l)) ctx = l;
        else if (!strcmp(a, "--device")) {
            if (kaon_cli_check_device(v, false)) return 2;
            device = v;
        } else if (!strcmp(a, "--kv-cache-dtype")) {
            if (kaon_cli_check_kv_dtype(v)) return 2;
            kv_dtype = v;
        } else return kaon_cli_fail("bad option or value: %s %s", a, v);
    }
    kaon_cli_quiet_logs();
    kaon_engine_options eo;
    kaon_engine_options_default(&eo);
    eo.device = device;
    eo.n_threads = (int)threads;
    eo.max_num_seqs = 1;
    eo.max_model_len = (int)ctx;
    eo.kv_cache_dtype = kv_dtype;
    chat c = {0};
    c.e = kaon_cli_engine(&eo, model, false);
    if (!c.e) return 2;
    int rc = 2;
    kaon_engine_info info;
    kaon_engine_get_info(c.e, &info);
    c.max_model_len = info.max_model_len;
    c.tok = kaon_engine_tokenizer(c.e);
    const char *src = kaon_tokenizer_chat_template(c.tok);
    if (!src) {
        src = kaon_fallback_chat_template(vocab_has, (void *)c.tok);
        fprintf(stderr, "kaon chat: %s has no chat template; using kaon's %s format\n", info.model_path,
                src == kaon_default_chat_template ? "ChatML" : "Gemma turn");
    }
    c.tmpl = kaon_chat_template_parse(src, strlen(src));
    if (!c.tmpl) { kaon_cli_fail("chat template: %s", kaon_last_error()); goto out; }
    kaon_sampling sp;
    kaon_engine_sampling_defaults(c.e, &sp);
    if (temp >= 0) sp.temperature = (float)temp;
    if (top_k >= 0) sp.top_k = (int)top_k;
    if (top_p >= 0) sp.top_p = (float)top_p;
    if (min_p >= 0) sp.min_p = (float)min_p;
    if (seed >= 0) {
        sp.has_seed = true;
        sp.seed = (uint64_t)seed;
    }
    if (sp.max_tokens > 0 && sp.max_tokens < max_new) max_new = sp.max_tokens;
    c.messages = cJSON_CreateArray();
    if (system) add_message(&c, "system", system);
    fprintf(stderr, "kaon chat: %s (%s). /reset starts over, /exit quits.\n", info.model_path, info.arch);
    char *line = NULL;
    size_t cap = 0;
    for (int turns = 0;; turns++) {
        fputs("> ", stdout);
        fflush(stdout);
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!n) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            cJSON_Delete(c.messages);
            c.messages = cJSON_CreateArray();
            if (system) add_message(&c, "system", system);
            continue;
        }
        add_message(&c, "user", line);
        // A seeded chat stays reproducible turn by turn, without repeating the first turn's draws.
        kaon_sampling tsp = sp;
        tsp.seed = sp.seed + (uint64_t)turns;
        char *answer = turn(&c, &tsp, (int)max_new);
        if (!answer) {  // drop the turn that could not run
            cJSON_DeleteItemFromArray(c.messages, cJSON_GetArraySize(c.messages) - 1);
            continue;
        }
        add_message(&c, "assistant", answer);
        free(answer);
    }
    free(line);
    rc = 0;
out:
    cJSON_Delete(c.messages);
    if (c.tmpl) kaon_chat_template_free(c.tmpl);
    kaon_engine_destroy(c.e);
    return rc;
}
