// kaon chat: an interactive conversation in the terminal, rendered with the model's chat
// template. The KV cache keeps the conversation: each turn computes only the new tokens.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/load.h"
#include "cli/seq.h"
#include "engine/sampler.h"
#include "template/chat_template.h"
#include "util/err.h"
#include "util/log.h"
#include "util/timer.h"

static void usage(void) {
    printf("usage: kaon chat [-m MODEL] [--system TEXT] [-n MAX_TOKENS_PER_TURN] [--temp T]\n"
           "                 [--top-k K] [--top-p P] [--seed S] [--threads N] [--ctx-size N]\n"
           "type a message and Enter; /reset starts over, /exit (or Ctrl-D) quits\n");
}

typedef struct chat {
    kaon_model *m;
    kaon_tokenizer *tok;
    kaon_chat_template *tmpl;
    cJSON *messages;
    kaon_seq seq;
    int32_t *cached;   // the tokens whose K/V the sequence holds
    int n_cached;
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

// Runs one assistant turn; streams it to stdout and returns its text (malloc'd).
static char *turn(chat *c, const kaon_sampling_params *sp, kaon_rng *rng, int max_new, void *scratch) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (render(c, &ids, &n)) {
        kaon_cli_fail("%s", kaon_last_error());
        return NULL;
    }
    if ((int)n + max_new > c->seq.max_ctx) {
        kaon_cli_fail("the conversation (%zu tokens) no longer fits the context (%d); /reset to start over", n, c->seq.max_ctx);
        free(ids);
        return NULL;
    }
    int common = 0;  // reuse the cached prefix of the conversation
    while (common < c->n_cached && common < (int)n - 1 && c->cached[common] == ids[common]) common++;
    kaon_seq_truncate(&c->seq, common);
    double t0 = kaon_now();
    if (kaon_seq_feed(&c->seq, ids + common, (int)n - common, NULL)) {
        kaon_cli_fail("%s", kaon_last_error());
        free(ids);
        return NULL;
    }
    memcpy(c->cached, ids, sizeof(int32_t) * n);
    c->n_cached = (int)n;
    free(ids);
    kaon_detok *dt = kaon_detok_new(c->tok, true);
    size_t cap = 256, len = 0;
    char *answer = malloc(cap);
    answer[0] = 0;
    int produced = 0;
    double t1 = kaon_now();
    for (; produced < max_new; produced++) {
        int id = kaon_sample(c->seq.logits, c->m->cfg.vocab_size, sp, rng, scratch);
        bool stop = kaon_tokenizer_is_eog(c->tok, id);
        for (int i = 0; i < c->m->cfg.n_eos_token_ids; i++) stop |= c->m->cfg.eos_token_ids[i] == id;
        if (stop) break;
        char *piece = NULL;
        size_t pl = 0;
        if (kaon_detok_push(dt, id, &piece, &pl) >= 0 && pl) {
            fwrite(piece, 1, pl, stdout);
            fflush(stdout);
            if (len + pl + 1 > cap) { cap = (len + pl + 1) * 2; answer = realloc(answer, cap); }
            memcpy(answer + len, piece, pl);
            len += pl;
            answer[len] = 0;
        }
        free(piece);
        c->cached[c->n_cached++] = id;
        if (kaon_seq_feed(&c->seq, &id, 1, NULL)) break;
    }
    char *piece = NULL;
    size_t pl = 0;
    if (kaon_detok_flush(dt, &piece, &pl) >= 0 && pl) {
        fwrite(piece, 1, pl, stdout);
        if (len + pl + 1 > cap) { cap = (len + pl + 1) * 2; answer = realloc(answer, cap); }
        memcpy(answer + len, piece, pl);
        len += pl;
        answer[len] = 0;
    }
    free(piece);
    kaon_detok_free(dt);
    double t2 = kaon_now();
    fprintf(stderr, "\n[%d prompt tokens in %.2f s, %d tokens at %.1f tok/s]\n", (int)n - common, t1 - t0,
            produced, produced > 0 ? produced / (t2 - t1) : 0.0);
    return answer;
}

int kaon_cmd_chat(int argc, char **argv) {
    const char *model = NULL, *system = NULL;
    long max_new = 512, threads = kaon_cli_default_threads(), ctx = 4096;
    kaon_sampling_params sp;
    kaon_sampling_params_default(&sp);
    sp.temperature = 0.7f;
    sp.top_k = 40;
    sp.top_p = 0.9f;
    sp.min_p = 0.05f;
    sp.seed = (uint64_t)(kaon_now() * 1e6);
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
        else if (!strcmp(a, "--temp") && kaon_cli_parse_float(v, 0, 100, &d)) sp.temperature = (float)d;
        else if (!strcmp(a, "--top-k") && kaon_cli_parse_int(v, 0, 1 << 24, &l)) sp.top_k = (int)l;
        else if (!strcmp(a, "--top-p") && kaon_cli_parse_float(v, 0, 1, &d)) sp.top_p = (float)d;
        else if (!strcmp(a, "--seed") && kaon_cli_parse_int(v, 0, 0x7fffffffffffffffL, &l)) sp.seed = (uint64_t)l;
        else if (!strcmp(a, "--threads") && kaon_cli_parse_int(v, 1, 1024, &l)) threads = l;
        else if (!strcmp(a, "--ctx-size") && kaon_cli_parse_int(v, 64, 1 << 24, &l)) ctx = l;
        else return kaon_cli_fail("bad option or value: %s %s", a, v);
    }
    chat c = {0};
    c.m = kaon_cli_load_model(model);
    if (!c.m) return 2;
    int rc = 2;
    kaon_backend *be = NULL;
    c.tok = kaon_cli_load_tokenizer(c.m);
    if (!c.tok) goto out;
    const char *src = kaon_tokenizer_chat_template(c.tok);
    if (!src) {
        KAON_INFO("%s has no chat template; using kaon's default (ChatML)", c.m->path);
        src = kaon_default_chat_template;
    }
    c.tmpl = kaon_chat_template_parse(src, strlen(src));
    if (!c.tmpl) { kaon_cli_fail("chat template: %s", kaon_last_error()); goto out; }
    if (ctx > c.m->cfg.max_position_embeddings) ctx = c.m->cfg.max_position_embeddings;
    be = kaon_backend_cpu_create((int)threads);
    if (!be || kaon_seq_init(&c.seq, c.m, be, (int)ctx, 256, false)) { kaon_cli_fail("%s", kaon_last_error()); goto out; }
    c.cached = malloc(sizeof(int32_t) * (size_t)c.seq.max_ctx);
    c.messages = cJSON_CreateArray();
    if (system) add_message(&c, "system", system);
    kaon_rng rng;
    kaon_rng_seed(&rng, sp.seed);
    void *scratch = malloc(kaon_sample_scratch_bytes(c.m->cfg.vocab_size));
    fprintf(stderr, "kaon chat: %s (%s). /reset starts over, /exit quits.\n", c.m->path, c.m->cfg.arch_name);
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
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
            c.n_cached = 0;
            kaon_seq_truncate(&c.seq, 0);
            continue;
        }
        add_message(&c, "user", line);
        char *answer = turn(&c, &sp, &rng, (int)max_new, scratch);
        if (!answer) {  // drop the turn that could not run
            cJSON_DeleteItemFromArray(c.messages, cJSON_GetArraySize(c.messages) - 1);
            continue;
        }
        add_message(&c, "assistant", answer);
        free(answer);
    }
    free(line);
    free(scratch);
    rc = 0;
out:
    if (c.seq.runner) kaon_seq_free(&c.seq);
    if (be) be->ops->destroy(be);
    free(c.cached);
    cJSON_Delete(c.messages);
    if (c.tmpl) kaon_chat_template_free(c.tmpl);
    if (c.tok) kaon_tokenizer_free(c.tok);
    kaon_model_free(c.m);
    return rc;
}
