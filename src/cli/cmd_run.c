// kaon run: raw completion of one prompt through the engine (the same path, defaults and
// sampling as `kaon serve`), streamed to stdout; speeds to stderr.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/load.h"
#include "engine/step_times.h"
#include "kaon.h"
#include "tokenizer/tokenizer.h"
#include "util/timer.h"

#define MAX_STOP 16
#define MAX_BIAS 1024

static void usage(void) {
    printf("usage: kaon run [-m MODEL] (-p TEXT | --prompt-ids 1,2,3) [options]\n"
           "  -m, --model PATH       GGUF file or Hugging Face folder (default: SmolLM2-135M-Instruct Q4_1)\n"
           "  -p, --prompt TEXT      prompt text (tokenized with the model's tokenizer, BOS as the model says)\n"
           "  --prompt-ids IDS       prompt as token ids, e.g. 1,2,3\n"
           "  -n, --max-tokens N     tokens to generate (default: generation_config's max_new_tokens, else 128)\n"
           "sampling (defaults as in kaon serve: the model's generation_config.json, else the value shown):\n"
           "  --temp T               temperature, 0 = greedy (1)\n"
           "  --top-k K              keep the K likeliest tokens (0 = off)\n"
           "  --top-p P              nucleus sampling (1 = off)\n"
           "  --min-p P              drop tokens below P x the likeliest one's probability (0 = off)\n"
           "  --repeat-penalty F     HF repetition penalty over prompt and output (1 = off)\n"
           "  --presence-penalty F   OpenAI presence penalty over the output, -2..2 (0)\n"
           "  --frequency-penalty F  OpenAI frequency penalty over the output, -2..2 (0)\n"
           "  --logit-bias ID=BIAS   add BIAS (-100..100) to token ID's logit (repeatable)\n"
           "  --stop TEXT            stop at this string, not printed (repeatable, up to 16)\n"
           "  --seed S               random seed (default: random)\n"
           "  --ignore-eos           keep generating past end-of-sequence tokens\n"
           "engine:\n"
           "  --threads N            CPU threads (default: physical cores)\n"
           "  -tp, --tensor-parallel-size N  ranks of tensor parallelism (CPU: a worker thread each; CUDA: a GPU each)\n"
           "  --enable-expert-parallel       MoE models under -tp: experts placed whole on ranks, not split\n"
           "  --data-parallel-size D         with --enable-expert-parallel: DP attention over D ranks\n"
           "  --device DEV           where the model runs: cpu (default), cuda, cuda:N\n"
           "  --load-format F        auto (the model's files) or dummy (random weights from config.json)\n"
           "  --ctx-size N           context length (default 4096)\n"
           "  --kv-cache-dtype T     " KAON_CLI_KV_DTYPE_HELP "\n"
           "  --speculative-config JSON  " KAON_CLI_SPEC_HELP "\n"
           "output:\n"
           "  --print-ids            print the generated ids as one JSON list instead of text\n");
}

typedef struct run_opts {
    const char *model, *prompt, *prompt_ids, *device, *kv_dtype;
    kaon_speculative_options spec;
    bool dummy;
    long n_predict, threads, ctx, tp, dp;
    kaon_sampling sp;
    const char *stop[MAX_STOP];
    kaon_logit_bias bias[MAX_BIAS];
    bool print_ids, n_set, ep;
    // Which sampling fields the user gave (the rest come from the engine's defaults).
    bool temp_set, top_k_set, top_p_set, min_p_set, rep_set;
} run_opts;

// "ID=BIAS" (llama.cpp writes ID+BIAS / ID-BIAS; both read here too).
static bool parse_bias(const char *v, kaon_logit_bias *b) {
    const char *sep = strpbrk(v, "=+-");
    if (!sep || sep == v) return false;
    char id[16];
    size_t n = (size_t)(sep - v);
    if (n >= sizeof id) return false;
    memcpy(id, v, n);
    id[n] = 0;
    long l;
    double d;
    if (!kaon_cli_parse_int(id, 0, 0x7fffffff, &l) || !kaon_cli_parse_float(*sep == '=' ? sep + 1 : sep, -100, 100, &d))
        return false;
    *b = (kaon_logit_bias){(int32_t)l, (float)d};
    return true;
}

static int parse(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    kaon_sampling_default(&o->sp);
    o->n_predict = 128;
    o->threads = kaon_cli_default_threads();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        double d;
#define NEED_VALUE() if (!v) return kaon_cli_fail("option %s needs a value", a); i++
#define FLOAT(lo, hi) NEED_VALUE(); if (!kaon_cli_parse_float(v, lo, hi, &d)) return kaon_cli_fail("bad %s '%s'", a, v)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 1; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { NEED_VALUE(); o->model = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { NEED_VALUE(); o->prompt = v; }
        else if (!strcmp(a, "--prompt-ids")) { NEED_VALUE(); o->prompt_ids = v; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
            NEED_VALUE(); if (!kaon_cli_parse_int(v, 0, 1 << 24, &l)) return kaon_cli_fail("bad -n '%s'", v);
            o->n_predict = l; o->n_set = true;
        } else if (!strcmp(a, "--temp") || !strcmp(a, "--temperature")) {
            FLOAT(0, 100); o->sp.temperature = (float)d; o->temp_set = true;
        } else if (!strcmp(a, "--top-k")) {
            NEED_VALUE(); if (!kaon_cli_parse_int(v, 0, 1 << 24, &l)) return kaon_cli_fail("bad --top-k '%s'", v);
            o->sp.top_k = (int)l; o->top_k_set = true;
        } else if (!strcmp(a, "--top-p")) {
            FLOAT(0, 1); o->sp.top_p = (float)d; o->top_p_set = true;
        } else if (!strcmp(a, "--min-p")) {
            FLOAT(0, 1); o->sp.min_p = (float)d; o->min_p_set = true;
        } else if (!strcmp(a, "--repeat-penalty") || !strcmp(a, "--repetition-penalty")) {
            FLOAT(0.001, 10); o->sp.repetition_penalty = (float)d; o->rep_set = true;
        } else if (!strcmp(a, "--presence-penalty")) {
            FLOAT(-2, 2); o->sp.presence_penalty = (float)d;
        } else if (!strcmp(a, "--frequency-penalty")) {
            FLOAT(-2, 2); o->sp.frequency_penalty = (float)d;
        } else if (!strcmp(a, "--logit-bias") || !strcmp(a, "-l")) {
            NEED_VALUE();
            if (o->sp.n_logit_bias == MAX_BIAS) return kaon_cli_fail("at most %d --logit-bias", MAX_BIAS);
            if (!parse_bias(v, &o->bias[o->sp.n_logit_bias]))
                return kaon_cli_fail("bad --logit-bias '%s' (ID=BIAS, BIAS in -100..100)", v);
            o->sp.n_logit_bias++;
        } else if (!strcmp(a, "--stop")) {
            NEED_VALUE();
            if (o->sp.n_stop == MAX_STOP) return kaon_cli_fail("at most %d --stop strings", MAX_STOP);
            if (!*v) return kaon_cli_fail("--stop needs a non-empty string");
            o->stop[o->sp.n_stop++] = v;
        } else if (!strcmp(a, "--seed")) {
            NEED_VALUE(); char *end; o->sp.seed = strtoull(v, &end, 10);
            if (*end || !*v || *v == '-') return kaon_cli_fail("bad --seed '%s'", v);
            o->sp.has_seed = true;
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            NEED_VALUE(); if (!kaon_cli_parse_int(v, 1, 1024, &l)) return kaon_cli_fail("bad --threads '%s'", v);
            o->threads = l;
        } else if (!strcmp(a, "--enable-expert-parallel")) {
            o->ep = true;
        } else if (!strcmp(a, "--tensor-parallel-size") || !strcmp(a, "-tp")) {
            NEED_VALUE(); if (!kaon_cli_parse_int(v, 1, 64, &l)) return kaon_cli_fail("bad --tensor-parallel-size '%s'", v);
            o->tp = l;
        } else if (!strcmp(a, "--data-parallel-size") || !strcmp(a, "-dp")) {
            NEED_VALUE(); if (!kaon_cli_parse_int(v, 1, 64, &l)) return kaon_cli_fail("bad --data-parallel-size '%s'", v);
            o->dp = l;
        } else if (!strcmp(a, "--ctx-size") || !strcmp(a, "-c")) {
            NEED_VALUE(); if (!kaon_cli_parse_int(v, 16, 1 << 24, &l)) return kaon_cli_fail("bad --ctx-size '%s'", v);
            o->ctx = l;
        } else if (!strcmp(a, "--speculative-config")) {
            NEED_VALUE();
            if (kaon_cli_parse_spec_config(v, &o->spec)) return 2;
        } else if (!strcmp(a, "--kv-cache-dtype")) {
            NEED_VALUE();
            if (kaon_cli_check_kv_dtype(v)) return 2;
            o->kv_dtype = v;
        } else if (!strcmp(a, "--device")) {
            NEED_VALUE();
            if (kaon_cli_check_device(v, false)) return 2;
            o->device = v;
        } else if (!strcmp(a, "--load-format")) {
            NEED_VALUE();
            if (strcmp(v, "auto") && strcmp(v, "dummy")) return kaon_cli_fail("bad --load-format '%s' (auto, dummy)", v);
            o->dummy = !strcmp(v, "dummy");
        } else if (!strcmp(a, "--ignore-eos")) o->sp.ignore_eos = true;
        else if (!strcmp(a, "--print-ids")) o->print_ids = true;
        else return kaon_cli_fail("unknown option '%s' (see kaon run --help)", a);
#undef FLOAT
#undef NEED_VALUE
    }
    if (!o->prompt == !o->prompt_ids) return kaon_cli_fail("give exactly one of -p TEXT or --prompt-ids IDS");
    return 0;
}

// The user's sampling flags over the engine's defaults (generation_config.json, then OpenAI's).
static void apply_defaults(kaon_engine *e, run_opts *o) {
    kaon_sampling d;
    kaon_engine_sampling_defaults(e, &d);
    if (!o->temp_set) o->sp.temperature = d.temperature;
    if (!o->top_k_set) o->sp.top_k = d.top_k;
    if (!o->top_p_set) o->sp.top_p = d.top_p;
    if (!o->min_p_set) o->sp.min_p = d.min_p;
    if (!o->rep_set) o->sp.repetition_penalty = d.repetition_penalty;
    if (!o->n_set && d.max_tokens > 0) o->n_predict = d.max_tokens;
    o->sp.stop = o->stop;
    o->sp.logit_bias = o->bias;
}

static void write_text(const char *s, size_t n) {
    if (!n) return;
    fwrite(s, 1, n, stdout);
    fflush(stdout);
}

int kaon_cmd_run(int argc, char **argv) {
    run_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    kaon_cli_quiet_logs();
    kaon_engine_options eo;
    kaon_engine_options_default(&eo);
    eo.device = o.device;
    eo.n_threads = (int)o.threads;
    eo.tensor_parallel_size = (int)o.tp;
    eo.enable_expert_parallel = o.ep;
    eo.data_parallel_size = (int)o.dp;
    eo.max_num_seqs = 1;
    eo.max_model_len = o.ctx ? (int)o.ctx : 4096;
    eo.kv_cache_dtype = o.kv_dtype;
    eo.speculative = o.spec;
    // Ids in and ids out need no tokenizer (test checkpoints may have none); stop strings do.
    eo.load_tokenizer = o.prompt || !o.print_ids || o.sp.n_stop > 0;
    kaon_engine *e = kaon_cli_engine(&eo, o.model, o.dummy);
    if (!e) return 2;
    apply_defaults(e, &o);
    kaon_engine_info info;
    kaon_engine_get_info(e, &info);
    const kaon_tokenizer *tok = kaon_engine_tokenizer(e);

    int32_t *prompt = NULL, *gen = NULL;
    int n_prompt = 0, n_gen = 0;
    kaon_request *r = NULL;
    rc = 2;
    if (o.prompt) {
        size_t n = 0;
        if (kaon_tokenize(tok, o.prompt, strlen(o.prompt), true, &prompt, &n)) {
            kaon_cli_fail("tokenize: %s", kaon_last_error());
            goto out;
        }
        n_prompt = (int)n;
    } else if (kaon_cli_parse_ids(o.prompt_ids, &prompt, &n_prompt)) {
        kaon_cli_fail("bad --prompt-ids '%s'", o.prompt_ids);
        goto out;
    }
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= info.vocab_size) {
            kaon_cli_fail("prompt id %d is outside the vocabulary (%d)", prompt[i], info.vocab_size);
            goto out;
        }
    if (n_prompt == 0) {
        kaon_cli_fail("empty prompt");
        goto out;
    }
    if (n_prompt >= info.max_model_len) {
        kaon_cli_fail("prompt of %d tokens does not fit the context of %d", n_prompt, info.max_model_len);
        goto out;
    }
    if (n_prompt + o.n_predict > info.max_model_len) o.n_predict = info.max_model_len - n_prompt;
    if (o.n_predict == 0) {  // nothing to generate: the output of an empty generation
        printf(o.print_ids ? "[]\n" : "\n");
        rc = 0;
        goto out;
    }
    o.sp.max_tokens = (int)o.n_predict;
    if (!(gen = malloc(sizeof(int32_t) * (size_t)o.n_predict))) {
        kaon_cli_fail("out of memory");
        goto out;
    }

    double t0 = kaon_now(), t_first = 0;
    if (!(r = kaon_engine_submit(e, prompt, n_prompt, &o.sp))) {
        kaon_cli_fail("%s", kaon_last_error());
        goto out;
    }
    kaon_output out;
    bool failed = false;
    while (kaon_request_next(r, &out, -1) == 1) {
        if (out.n_tokens > 0 && t_first == 0) t_first = t0 + out.first_token_time;
        for (int i = 0; i < out.n_tokens && n_gen < o.n_predict; i++) gen[n_gen++] = out.token_ids[i];
        if (!o.print_ids) write_text(out.text, out.text_len);
        if (out.finish == KAON_FINISH_ERROR) {
            kaon_cli_fail("%s", out.error ? out.error : "generation failed");
            failed = true;
        }
        if (out.finished) break;
    }
    if (failed) goto out;
    double t2 = kaon_now();
    if (t_first == 0) t_first = t2;
    if (o.print_ids) {
        printf("[");
        for (int i = 0; i < n_gen; i++) printf(i ? ", %d" : "%d", gen[i]);
        printf("]\n");
    } else {
        printf("\n");
    }
    // The prompt's time runs to its first token; the last token needs no forward pass, so the
    // speed counts the passes that ran after the first.
    int n_steps = n_gen > 0 ? n_gen - 1 : 0;
    fprintf(stderr, "\nkaon: prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens, %.1f tok/s\n",
            n_prompt, t_first - t0, n_prompt / (t_first - t0), n_gen,
            n_steps > 0 ? n_steps / (t2 - t_first) : 0.0);
    kaon_step_times stt;
    kaon_engine_step_times(e, &stt);
    if (stt.decode_steps)  // the engine thread's own share of each step: what overlapping it would win
        fprintf(stderr, "kaon: %llu decode steps, %.1f us each, of which %.1f us on the host\n",
                (unsigned long long)stt.decode_steps, stt.decode_seconds / (double)stt.decode_steps * 1e6,
                stt.decode_host_seconds / (double)stt.decode_steps * 1e6);
    if (o.spec.method) {
        kaon_engine_stats st;
        kaon_engine_get_stats(e, &st);
        fprintf(stderr, "kaon: speculative: %llu verify steps, %llu of %llu drafts accepted, %.2f tokens per verify step\n",
                (unsigned long long)st.spec_drafts, (unsigned long long)st.spec_accepted_tokens,
                (unsigned long long)st.spec_draft_tokens,
                st.spec_drafts ? (double)(st.spec_accepted_tokens + st.spec_drafts) / (double)st.spec_drafts : 0.0);
    }
    rc = 0;
out:
    kaon_request_free(r);
    free(prompt);
    free(gen);
    kaon_engine_destroy(e);
    return rc;
}
