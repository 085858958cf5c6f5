// kaon run: raw completion of one prompt, streamed to stdout; speeds to stderr.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/load.h"
#include "backend/device.h"
#include "cli/seq.h"
#include "engine/sampler.h"
#include "util/err.h"
#include "util/timer.h"

static void usage(void) {
    printf("usage: kaon run [-m MODEL] (-p TEXT | --prompt-ids 1,2,3) [options]\n"
           "  -m, --model PATH     GGUF file or Hugging Face folder (default: SmolLM2-135M-Instruct Q4_1)\n"
           "  -p, --prompt TEXT    prompt text (tokenized with the model's tokenizer, BOS as the model says)\n"
           "  --prompt-ids IDS     prompt as token ids, e.g. 1,2,3\n"
           "  -n, --max-tokens N   tokens to generate (default 128)\n"
           "  --temp T             temperature, 0 = greedy (default: generation_config, else 0.8)\n"
           "  --top-k K            (default: generation_config, else 40; 0 = off)\n"
           "  --top-p P            (default: generation_config, else 0.95)\n"
           "  --min-p P            (default 0.05)\n"
           "  --seed S             random seed (default: time)\n"
           "  --threads N          CPU threads (default: all cores)\n"
           "  --device DEV         where the model runs: cpu (default), cuda, cuda:N\n"
           "  --load-format F      auto (the model's files) or dummy (random weights from config.json)\n"
           "  --ctx-size N         context length (default: min(model's, 4096))\n"
           "  --ignore-eos         keep generating past end-of-sequence tokens\n"
           "  --print-ids          print the generated ids as one JSON list instead of text\n");
}

typedef struct run_opts {
    const char *model, *prompt, *prompt_ids, *device;
    bool dummy;
    long n_predict, threads, ctx;
    kaon_sampling_params sp;
    bool ignore_eos, print_ids, seed_set, temp_set, top_k_set, top_p_set;
} run_opts;

static int parse(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    kaon_sampling_params_default(&o->sp);
    o->sp.temperature = 0.8f;
    o->sp.top_k = 40;
    o->sp.top_p = 0.95f;
    o->sp.min_p = 0.05f;
    o->n_predict = 128;
    o->threads = kaon_cli_default_threads();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        double d;
#define NEED_VALUE() if (!v) return kaon_cli_fail("option %s needs a value", a); i++
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 1; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { NEED_VALUE(); o->model = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { NEED_VALUE(); o->prompt = v; }
        else if (!strcmp(a, "--prompt-ids")) { NEED_VALUE(); o->prompt_ids = v; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
            NEED_VALUE(); if (!kaon_cli_parse_int(v, 0, 1 << 24, &l)) return kaon_cli_fail("bad -n '%s'", v);
            o->n_predict = l;
        } else if (!strcmp(a, "--temp") || !strcmp(a, "--temperature")) {
            NEED_VALUE(); if (!kaon_cli_parse_float(v, 0, 100, &d)) return kaon_cli_fail("bad --temp '%s'", v);
            o->sp.temperature = (float)d; o->temp_set = true;
        } else if (!strcmp(a, "--top-k")) {
            NEED_VALUE(); if (!kaon_cli_parse_int(v, 0, 1 << 24, &l)) return kaon_cli_fail("bad --top-k '%s'", v);
            o->sp.top_k = (int)l; o->top_k_set = true;
        } else if (!strcmp(a, "--top-p")) {
            NEED_VALUE(); if (!kaon_cli_parse_float(v, 0, 1, &d)) return kaon_cli_fail("bad --top-p '%s'", v);
            o->sp.top_p = (float)d; o->top_p_set = true;
        } else if (!strcmp(a, "--min-p")) {
            NEED_VALUE(); if (!kaon_cli_parse_float(v, 0, 1, &d)) return kaon_cli_fail("bad --min-p '%s'", v);
            o->sp.min_p = (float)d;
        } else if (!strcmp(a, "--seed")) {
            NEED_VALUE(); char *end; o->sp.seed = strtoull(v, &end, 10);
            if (*end || !*v) return kaon_cli_fail("bad --seed '%s'", v);
            o->seed_set = true;
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            NEED_VALUE(); if (!kaon_cli_parse_int(v, 1, 1024, &l)) return kaon_cli_fail("bad --threads '%s'", v);
            o->threads = l;
        } else if (!strcmp(a, "--ctx-size") || !strcmp(a, "-c")) {
            NEED_VALUE(); if (!kaon_cli_parse_int(v, 16, 1 << 24, &l)) return kaon_cli_fail("bad --ctx-size '%s'", v);
            o->ctx = l;
        } else if (!strcmp(a, "--device")) {
            NEED_VALUE();
            if (kaon_cli_check_device(v, false)) return 2;
            o->device = v;
        } else if (!strcmp(a, "--load-format")) {
            NEED_VALUE();
            if (strcmp(v, "auto") && strcmp(v, "dummy")) return kaon_cli_fail("bad --load-format '%s' (auto, dummy)", v);
            o->dummy = !strcmp(v, "dummy");
        } else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = true;
        else if (!strcmp(a, "--print-ids")) o->print_ids = true;
        else return kaon_cli_fail("unknown option '%s' (see kaon run --help)", a);
#undef NEED_VALUE
    }
    if (!o->prompt == !o->prompt_ids) return kaon_cli_fail("give exactly one of -p TEXT or --prompt-ids IDS");
    return 0;
}

static bool is_stop(const kaon_model *m, const kaon_tokenizer *tok, int id) {
    for (int i = 0; i < m->cfg.n_eos_token_ids; i++)
        if (m->cfg.eos_token_ids[i] == id) return true;
    return tok && kaon_tokenizer_is_eog(tok, id);
}

int kaon_cmd_run(int argc, char **argv) {
    run_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    kaon_model *m = NULL;
    if (o.dummy) {
        if (!o.model) return kaon_cli_fail("--load-format dummy needs -m CONFIG (a config.json or its folder)");
        m = kaon_model_load_dummy(o.model);
        if (!m) return kaon_cli_fail("%s", kaon_last_error());
    } else {
        m = kaon_cli_load_model(o.model);
    }
    if (!m) return 2;
    const kaon_model_config *c = &m->cfg;
    // Sampling defaults from generation_config.json where the user gave none.
    if (!o.temp_set && c->gen_temperature >= 0) o.sp.temperature = c->gen_temperature;
    if (!o.top_k_set && c->gen_top_k >= 0) o.sp.top_k = c->gen_top_k;
    if (!o.top_p_set && c->gen_top_p >= 0) o.sp.top_p = c->gen_top_p;
    if (!o.seed_set) o.sp.seed = (uint64_t)(kaon_now() * 1e6);

    kaon_tokenizer *tok = NULL;
    int32_t *prompt = NULL;
    int n_prompt = 0;
    rc = 2;
    if (o.prompt) {
        tok = kaon_cli_load_tokenizer(m);
        if (!tok) goto out;
        size_t n = 0;
        if (kaon_tokenize(tok, o.prompt, strlen(o.prompt), true, &prompt, &n)) {
            kaon_cli_fail("tokenize: %s", kaon_last_error());
            goto out;
        }
        n_prompt = (int)n;
    } else {
        if (kaon_cli_parse_ids(o.prompt_ids, &prompt, &n_prompt)) {
            kaon_cli_fail("bad --prompt-ids '%s'", o.prompt_ids);
            goto out;
        }
        for (int i = 0; i < n_prompt; i++)
            if (prompt[i] >= c->vocab_size) {
                kaon_cli_fail("prompt id %d is outside the vocabulary (%d)", prompt[i], c->vocab_size);
                goto out;
            }
        if (!o.print_ids) tok = kaon_cli_load_tokenizer(m);
        if (!o.print_ids && !tok) goto out;
    }
    if (n_prompt == 0) {
        kaon_cli_fail("empty prompt");
        goto out;
    }
    long ctx = o.ctx ? o.ctx : (c->max_position_embeddings < 4096 ? c->max_position_embeddings : 4096);
    if (n_prompt + o.n_predict > ctx) {
        if (n_prompt >= ctx) {
            kaon_cli_fail("prompt of %d tokens does not fit the context of %ld", n_prompt, ctx);
            goto out;
        }
        o.n_predict = ctx - n_prompt;
    }
    kaon_device dev;
    kaon_backend *be = kaon_device_parse(o.device, &dev) ? NULL : kaon_backend_create(&dev, (int)o.threads);
    if (!be) { kaon_cli_fail("%s", kaon_last_error()); goto out; }
    kaon_seq seq;
    if (kaon_seq_init(&seq, m, be, (int)ctx, 256, false)) {
        kaon_cli_fail("%s", kaon_last_error());
        be->ops->destroy(be);
        goto out;
    }
    kaon_rng rng;
    kaon_rng_seed(&rng, o.sp.seed);
    void *scratch = malloc(kaon_sample_scratch_bytes(c->vocab_size));
    int32_t *gen = malloc(sizeof(int32_t) * (size_t)(o.n_predict + 1));
    kaon_detok *dt = tok ? kaon_detok_new(tok, true) : NULL;
    if (!scratch || !gen || (tok && !dt)) { kaon_cli_fail("out of memory"); goto done; }

    double t0 = kaon_now();
    if (kaon_seq_feed(&seq, prompt, n_prompt, NULL)) { kaon_cli_fail("%s", kaon_last_error()); goto done; }
    double t1 = kaon_now();
    int n_gen = 0;
    while (n_gen < o.n_predict) {
        int id = kaon_sample(seq.logits, c->vocab_size, &o.sp, &rng, scratch);
        gen[n_gen++] = id;
        if (!o.ignore_eos && is_stop(m, tok, id)) break;
        if (dt && !o.print_ids) {
            char *piece = NULL;
            size_t len = 0;
            if (kaon_detok_push(dt, id, &piece, &len) >= 0 && len) {
                fwrite(piece, 1, len, stdout);
                fflush(stdout);
            }
            free(piece);
        }
        if (n_gen == o.n_predict) break;
        if (kaon_seq_feed(&seq, &gen[n_gen - 1], 1, NULL)) { kaon_cli_fail("%s", kaon_last_error()); goto done; }
    }
    double t2 = kaon_now();
    if (o.print_ids) {
        printf("[");
        for (int i = 0; i < n_gen; i++) printf(i ? ", %d" : "%d", gen[i]);
        printf("]\n");
    } else if (dt) {
        char *piece = NULL;
        size_t len = 0;
        if (kaon_detok_flush(dt, &piece, &len) >= 0 && len) fwrite(piece, 1, len, stdout);
        free(piece);
        printf("\n");
    }
    // The last sampled token needs no forward pass; speeds count the passes that ran.
    int n_steps = n_gen > 0 ? n_gen - 1 : 0;
    fprintf(stderr, "\nkaon: prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens, %.1f tok/s\n",
            n_prompt, t1 - t0, n_prompt / (t1 - t0), n_gen, n_steps > 0 ? n_steps / (t2 - t1) : 0.0);
    rc = 0;
done:
    if (dt) kaon_detok_free(dt);
    free(scratch);
    free(gen);
    kaon_seq_free(&seq);
    be->ops->destroy(be);
out:
    free(prompt);
    if (tok) kaon_tokenizer_free(tok);
    kaon_model_free(m);
    return rc;
}
