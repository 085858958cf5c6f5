// kaon generate: offline batch generation through the engine (like vLLM's LLM.generate).
// Input JSONL lines {"prompt": "..."} or {"prompt_ids": [...]} with optional OpenAI-named
// sampling fields; output JSONL in input order.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/load.h"
#include "engine/step_times.h"
#include "kaon.h"
#include "tokenizer/tokenizer.h"
#include "util/timer.h"

static void usage(void) {
    printf("usage: kaon generate [-m MODEL] --input prompts.jsonl --output out.jsonl [options]\n"
           "  input lines: {\"prompt\": \"...\"} or {\"prompt_ids\": [...]}, optionally with max_tokens,\n"
           "  temperature, top_p, top_k, min_p, seed, stop, stop_token_ids, ignore_eos, min_tokens,\n"
           "  presence_penalty, frequency_penalty, repetition_penalty, logit_bias (flags set defaults)\n"
           "  --max-tokens N  --temp T  --top-p P  --top-k K  --min-p P  --seed S  --ignore-eos\n"
           "  --threads N  -tp|--tensor-parallel-size N  --enable-expert-parallel  -dp|--data-parallel-size D  --max-num-seqs N  --max-num-batched-tokens N  --max-model-len N\n"
           "  --kv-cache-memory MIB  --block-size N  --no-prefix-caching  --quiet\n"
           "  --kv-cache-dtype T (" KAON_CLI_KV_DTYPE_HELP ")\n"
           "  --speculative-config JSON (" KAON_CLI_SPEC_HELP ")\n"
           "  --expert-stats (MoE models: tokens routed to each expert, a kaon-expert-load line on stderr)\n"
           "  --device cpu|cuda|cuda:N|noop (noop: no math, to measure the engine's own cost)\n"
           "  --load-format auto|dummy (dummy: random weights from -m CONFIG, a config.json or its folder)\n"
           "  --gpu-memory-utilization F (fraction of GPU memory for weights, activations and KV; 0.9)\n");
}

// {"n_layers": L, "n_experts": E, "counts": [[...] per layer]} on stderr.
static void print_expert_load(kaon_engine *e) {
    int L = 0, E = 0;
    if (kaon_engine_expert_load(e, NULL, 0, &L, &E)) {
        fprintf(stderr, "kaon: expert load: %s\n", kaon_last_error());
        return;
    }
    uint64_t *c = malloc(sizeof *c * (size_t)L * (size_t)E);
    if (!c || kaon_engine_expert_load(e, c, (size_t)L * (size_t)E, NULL, NULL)) {
        free(c);
        return;
    }
    fprintf(stderr, "kaon-expert-load: {\"n_layers\": %d, \"n_experts\": %d, \"counts\": [", L, E);
    for (int l = 0; l < L; l++) {
        fprintf(stderr, "%s[", l ? ", " : "");
        for (int x = 0; x < E; x++) fprintf(stderr, x ? ", %llu" : "%llu", (unsigned long long)c[(size_t)l * E + x]);
        fprintf(stderr, "]");
    }
    fprintf(stderr, "]}\n");
    free(c);
}

typedef struct job {
    kaon_request *req;
    int32_t *ids;
    int n_ids;
    char *text;
    size_t text_len;
    int32_t *out_ids;
    int n_out, cap_out;
    kaon_finish finish;
    int prompt_tokens, completion_tokens, cached_tokens;
    bool done;
    char *error;
} job;

static const char *finish_name(kaon_finish f) {
    switch (f) {
    case KAON_FINISH_STOP: return "stop";
    case KAON_FINISH_LENGTH: return "length";
    case KAON_FINISH_ABORT: return "abort";
    default: return "error";
    }
}

// Reads per-request overrides from a JSON line into sp; stop strings point into j.
static int read_params(const cJSON *j, kaon_sampling *sp, const char **stops, int32_t *stop_ids,
                       kaon_logit_bias *bias, int line) {
    const cJSON *v;
#define NUM(name, field, cast)                                                            \
    if ((v = cJSON_GetObjectItemCaseSensitive(j, name))) {                                \
        if (!cJSON_IsNumber(v)) return kaon_cli_fail("line %d: %s must be a number", line, name); \
        sp->field = (cast)v->valuedouble;                                                 \
    }
    NUM("max_tokens", max_tokens, int);
    NUM("temperature", temperature, float);
    NUM("top_p", top_p, float);
    NUM("top_k", top_k, int);
    NUM("min_p", min_p, float);
    NUM("min_tokens", min_tokens, int);
    NUM("presence_penalty", presence_penalty, float);
    NUM("frequency_penalty", frequency_penalty, float);
    NUM("repetition_penalty", repetition_penalty, float);
#undef NUM
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "seed")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v)) return kaon_cli_fail("line %d: seed must be an integer", line);
        sp->has_seed = true;
        sp->seed = (uint64_t)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "ignore_eos"))) {
        if (!cJSON_IsBool(v)) return kaon_cli_fail("line %d: ignore_eos must be a boolean", line);
        sp->ignore_eos = cJSON_IsTrue(v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "stop")) && !cJSON_IsNull(v)) {
        sp->n_stop = 0;
        if (cJSON_IsString(v)) stops[sp->n_stop++] = v->valuestring;
        else if (cJSON_IsArray(v)) {
            const cJSON *s;
            cJSON_ArrayForEach(s, v) {
                if (!cJSON_IsString(s) || sp->n_stop == 16) return kaon_cli_fail("line %d: stop must be up to 16 strings", line);
                stops[sp->n_stop++] = s->valuestring;
            }
        } else return kaon_cli_fail("line %d: stop must be a string or a list of strings", line);
        sp->stop = stops;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "logit_bias")) && !cJSON_IsNull(v)) {
        const cJSON *b;
        sp->n_logit_bias = 0;
        if (!cJSON_IsObject(v)) return kaon_cli_fail("line %d: logit_bias must be an object {\"id\": bias}", line);
        cJSON_ArrayForEach(b, v) {
            char *end;
            long id = strtol(b->string, &end, 10);
            if (*end || !cJSON_IsNumber(b) || id < 0 || id > 0x7fffffff || sp->n_logit_bias == 64)
                return kaon_cli_fail("line %d: bad logit_bias entry '%s'", line, b->string);
            bias[sp->n_logit_bias++] = (kaon_logit_bias){(int32_t)id, (float)b->valuedouble};
        }
        sp->logit_bias = bias;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "stop_token_ids")) && !cJSON_IsNull(v)) {
        const cJSON *s;
        sp->n_stop_token_ids = 0;
        if (!cJSON_IsArray(v)) return kaon_cli_fail("line %d: stop_token_ids must be a list", line);
        cJSON_ArrayForEach(s, v) {
            if (!cJSON_IsNumber(s) || sp->n_stop_token_ids == 64) return kaon_cli_fail("line %d: bad stop_token_ids", line);
            stop_ids[sp->n_stop_token_ids++] = (int32_t)s->valuedouble;
        }
        sp->stop_token_ids = stop_ids;
    }
    return 0;
}

static int parse_prompt(const cJSON *j, const kaon_tokenizer *tok, job *jb, int line) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt_ids");
    if (p) {
        if (!cJSON_IsArray(p)) return kaon_cli_fail("line %d: prompt_ids must be a list of ids", line);
        int n = cJSON_GetArraySize(p), k = 0;
        jb->ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
        const cJSON *x;
        cJSON_ArrayForEach(x, p) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 2147483647.0)
                return kaon_cli_fail("line %d: prompt_ids must be non-negative integers", line);
            jb->ids[k++] = (int32_t)x->valuedouble;
        }
        jb->n_ids = k;
        return 0;
    }
    p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    if (!cJSON_IsString(p)) return kaon_cli_fail("line %d: needs \"prompt\" (string) or \"prompt_ids\"", line);
    if (!tok) return kaon_cli_fail("line %d: text prompts need the model's tokenizer", line);
    size_t n = 0;
    if (kaon_tokenize(tok, p->valuestring, strlen(p->valuestring), true, &jb->ids, &n))
        return kaon_cli_fail("line %d: %s", line, kaon_last_error());
    jb->n_ids = (int)n;
    return 0;
}

// The step split (steps that computed prompt tokens against decode-only steps, with their wall
// time) says where a long run's time goes while it runs.
static void progress(kaon_engine *e, int done, int total, uint64_t toks, double t0) {
    double dt = kaon_now() - t0;
    int w = 30, fill = total ? done * w / total : w;
    char bar[64];
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = 0;
    kaon_step_times st;
    kaon_engine_step_times(e, &st);
    fprintf(stderr, "\r[%s] %d/%d requests, %llu tokens, %.1f tok/s; steps: %llu prefill %.1f s, %llu decode %.1f s ",
            bar, done, total, (unsigned long long)toks, dt > 0 ? toks / dt : 0.0,
            (unsigned long long)st.prefill_steps, st.prefill_seconds, (unsigned long long)st.decode_steps,
            st.decode_seconds);
}

static void collect(job *jb, const kaon_output *o) {
    if (o->n_tokens) {
        if (jb->n_out + o->n_tokens > jb->cap_out) {
            jb->cap_out = (jb->n_out + o->n_tokens) * 2;
            jb->out_ids = realloc(jb->out_ids, sizeof(int32_t) * (size_t)jb->cap_out);
        }
        memcpy(jb->out_ids + jb->n_out, o->token_ids, sizeof(int32_t) * (size_t)o->n_tokens);
        jb->n_out += o->n_tokens;
    }
    if (o->text_len) {
        jb->text = realloc(jb->text, jb->text_len + o->text_len + 1);
        memcpy(jb->text + jb->text_len, o->text, o->text_len);
        jb->text_len += o->text_len;
        jb->text[jb->text_len] = 0;
    }
    jb->prompt_tokens = o->prompt_tokens;
    jb->completion_tokens = o->completion_tokens;
    jb->cached_tokens = o->cached_tokens;
    if (o->finish != KAON_FINISH_NONE) jb->finish = o->finish;
    if (o->error && !jb->error) jb->error = strdup(o->error);
    if (o->finished) jb->done = true;
}

int kaon_cmd_generate(int argc, char **argv) {
    kaon_engine_options eo;
    kaon_engine_options_default(&eo);
    kaon_sampling dflt;
    kaon_sampling_default(&dflt);
    const char *in_path = NULL, *out_path = NULL;
    bool quiet = false, dummy = false;
    char *dummy_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        double d;
        bool flag = !strcmp(a, "--ignore-eos") || !strcmp(a, "--no-prefix-caching") || !strcmp(a, "--quiet") ||
                    !strcmp(a, "--expert-stats") || !strcmp(a, "--enable-expert-parallel") || !strcmp(a, "-h") ||
                    !strcmp(a, "--help");
        if (!flag && !v) return kaon_cli_fail("option %s needs a value", a);
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) eo.model = argv[++i];
        else if (!strcmp(a, "--input")) in_path = argv[++i];
        else if (!strcmp(a, "--device")) { if (kaon_cli_check_device(v, true)) return 2; eo.device = argv[++i]; }
        else if (!strcmp(a, "--load-format") && (!strcmp(v, "auto") || !strcmp(v, "dummy"))) { dummy = !strcmp(v, "dummy"); i++; }
        else if (!strcmp(a, "--gpu-memory-utilization") && kaon_cli_parse_float(v, 0.05, 1, &d)) { eo.gpu_memory_utilization = d; i++; }
        else if (!strcmp(a, "--output")) out_path = argv[++i];
        else if (!strcmp(a, "--ignore-eos")) dflt.ignore_eos = true;
        else if (!strcmp(a, "--no-prefix-caching")) eo.disable_prefix_caching = true;
        else if (!strcmp(a, "--quiet")) quiet = true;
        else if (!strcmp(a, "--expert-stats")) eo.expert_stats = true;
        else if (!strcmp(a, "--enable-expert-parallel")) eo.enable_expert_parallel = true;
        else if (!strcmp(a, "--max-tokens") && kaon_cli_parse_int(v, 1, 1 << 24, &l)) { dflt.max_tokens = (int)l; i++; }
        else if (!strcmp(a, "--temp") && kaon_cli_parse_float(v, 0, 100, &d)) { dflt.temperature = (float)d; i++; }
        else if (!strcmp(a, "--top-p") && kaon_cli_parse_float(v, 0, 1, &d)) { dflt.top_p = (float)d; i++; }
        else if (!strcmp(a, "--top-k") && kaon_cli_parse_int(v, -1, 1 << 24, &l)) { dflt.top_k = (int)l; i++; }
        else if (!strcmp(a, "--min-p") && kaon_cli_parse_float(v, 0, 1, &d)) { dflt.min_p = (float)d; i++; }
        else if (!strcmp(a, "--seed") && kaon_cli_parse_int(v, 0, 0x7fffffffffffffffL, &l)) { dflt.has_seed = true; dflt.seed = (uint64_t)l; i++; }
        else if (!strcmp(a, "--threads") && kaon_cli_parse_int(v, 1, 1024, &l)) { eo.n_threads = (int)l; i++; }
        else if ((!strcmp(a, "--tensor-parallel-size") || !strcmp(a, "-tp")) && kaon_cli_parse_int(v, 1, 64, &l)) { eo.tensor_parallel_size = (int)l; i++; }
        else if ((!strcmp(a, "--data-parallel-size") || !strcmp(a, "-dp")) && kaon_cli_parse_int(v, 1, 64, &l)) { eo.data_parallel_size = (int)l; i++; }
        else if (!strcmp(a, "--max-num-seqs") && kaon_cli_parse_int(v, 1, 4096, &l)) { eo.max_num_seqs = (int)l; i++; }
        else if (!strcmp(a, "--max-num-batched-tokens") && kaon_cli_parse_int(v, 1, 1 << 20, &l)) { eo.max_num_batched_tokens = (int)l; i++; }
        else if (!strcmp(a, "--max-model-len") && kaon_cli_parse_int(v, 2, 1 << 24, &l)) { eo.max_model_len = (int)l; i++; }
        else if (!strcmp(a, "--kv-cache-memory") && kaon_cli_parse_float(v, 0.001, 1 << 20, &d)) { eo.kv_cache_memory = (size_t)(d * 1048576.0); i++; }
        else if (!strcmp(a, "--block-size") && kaon_cli_parse_int(v, 1, 1024, &l)) { eo.block_size = (int)l; i++; }
        else if (!strcmp(a, "--kv-cache-dtype") && v) { if (kaon_cli_check_kv_dtype(v)) return 2; eo.kv_cache_dtype = v; i++; }
        else if (!strcmp(a, "--speculative-config")) { if (kaon_cli_parse_spec_config(v, &eo.speculative)) return 2; i++; }
        else return kaon_cli_fail("bad option or value: %s %s (see kaon generate --help)", a, v ? v : "");
    }
    if (!in_path || !out_path) return kaon_cli_fail("--input and --output are required");
    if (dummy && !eo.model) return kaon_cli_fail("--load-format dummy needs -m CONFIG");
    if (!eo.model) eo.model = kaon_cli_default_model();
    if (!eo.model) return kaon_cli_fail("no model given and the default model is missing");
    if (dummy) {  // the model loader reads "dummy:<config>" as a dummy model
        size_t n = strlen(eo.model) + 8;
        dummy_path = malloc(n);
        if (!dummy_path) return kaon_cli_fail("out of memory");
        snprintf(dummy_path, n, "dummy:%s", eo.model);
        eo.model = dummy_path;
    }
    FILE *in = !strcmp(in_path, "-") ? stdin : fopen(in_path, "r");
    if (!in) { free(dummy_path); return kaon_cli_fail("cannot read %s", in_path); }

    // The engine loads a tokenizer when the model has one; tiny test checkpoints may not.
    kaon_engine *e = kaon_engine_create(&eo);
    if (!e) {
        eo.load_tokenizer = false;
        e = kaon_engine_create(&eo);
        if (!e) { if (in != stdin) fclose(in); free(dummy_path); return kaon_cli_fail("%s", kaon_last_error()); }
    }
    kaon_cli_follow_if_follower(e);
    const kaon_tokenizer *tok = kaon_engine_tokenizer(e);
    int cap = 64, n = 0, rc = 2;
    job *jobs = calloc((size_t)cap, sizeof *jobs);
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t len;
    double t0 = kaon_now();
    while ((len = getline(&line, &line_cap, in)) > 0) {
        if (strspn(line, " \t\r\n") == (size_t)len) continue;
        if (n == cap) {
            cap *= 2;
            jobs = realloc(jobs, sizeof *jobs * (size_t)cap);
            memset(jobs + n, 0, sizeof *jobs * (size_t)(cap - n));
        }
        job *jb = &jobs[n];
        cJSON *j = cJSON_ParseWithLength(line, (size_t)len);
        if (!cJSON_IsObject(j)) { cJSON_Delete(j); kaon_cli_fail("line %d: not a JSON object", n + 1); goto out; }
        kaon_sampling sp = dflt;
        const char *stops[16];
        int32_t stop_ids[64];
        kaon_logit_bias bias[64];
        if (read_params(j, &sp, stops, stop_ids, bias, n + 1) || parse_prompt(j, tok, jb, n + 1)) { cJSON_Delete(j); goto out; }
        jb->req = kaon_engine_submit(e, jb->ids, jb->n_ids, &sp);
        cJSON_Delete(j);
        if (!jb->req) { kaon_cli_fail("line %d: %s", n + 1, kaon_last_error()); n++; goto out; }
        n++;
    }
    int done = 0;
    uint64_t toks = 0;
    double last_draw = 0;
    while (done < n) {
        bool progressed = false;
        int first_open = -1;
        for (int i = 0; i < n; i++) {
            if (jobs[i].done) continue;
            kaon_output o;
            while (!jobs[i].done && kaon_request_next(jobs[i].req, &o, 0) == 1) {
                collect(&jobs[i], &o);
                toks += (uint64_t)o.n_tokens;
                progressed = true;
            }
            if (jobs[i].done) done++;
            else if (first_open < 0) first_open = i;
            // Drawn within the pass: while the engine outpaces this loop, one pass over thousands
            // of requests takes seconds, and a run stopped early (bench --time-limit) reads the
            // last line drawn.
            if (!quiet && kaon_now() - last_draw > 0.2) { progress(e, done, n, toks, t0); last_draw = kaon_now(); }
        }
        if (!progressed && first_open >= 0) {
            kaon_output o;
            if (kaon_request_next(jobs[first_open].req, &o, 20) == 1) {
                collect(&jobs[first_open], &o);
                toks += (uint64_t)o.n_tokens;
                if (jobs[first_open].done) done++;
            }
        }
    }
    double dt = kaon_now() - t0;
    if (!quiet) { progress(e, done, n, toks, t0); fputc('\n', stderr); }
    FILE *out = !strcmp(out_path, "-") ? stdout : fopen(out_path, "w");
    if (!out) { kaon_cli_fail("cannot write %s", out_path); goto out; }
    for (int i = 0; i < n; i++) {
        job *jb = &jobs[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "index", i);
        cJSON_AddStringToObject(o, "text", jb->text ? jb->text : "");
        cJSON *ids = cJSON_AddArrayToObject(o, "token_ids");
        for (int k = 0; k < jb->n_out; k++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(jb->out_ids[k]));
        cJSON_AddStringToObject(o, "finish_reason", finish_name(jb->finish));
        if (jb->error) cJSON_AddStringToObject(o, "error", jb->error);
        cJSON *u = cJSON_AddObjectToObject(o, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", jb->prompt_tokens);
        cJSON_AddNumberToObject(u, "completion_tokens", jb->completion_tokens);
        cJSON_AddNumberToObject(u, "total_tokens", jb->prompt_tokens + jb->completion_tokens);
        cJSON_AddNumberToObject(u, "cached_tokens", jb->cached_tokens);
        char *s = cJSON_PrintUnformatted(o);
        fprintf(out, "%s\n", s);
        free(s);
        cJSON_Delete(o);
    }
    if (out != stdout) fclose(out);
    kaon_engine_stats st;
    kaon_engine_get_stats(e, &st);
    kaon_step_times stt;
    kaon_engine_step_times(e, &stt);
    uint64_t prompt_sum = 0;
    for (int i = 0; i < n; i++) prompt_sum += (uint64_t)jobs[i].prompt_tokens;
    fprintf(stderr, "kaon: generate: %d requests, %llu prompt + %llu generated tokens in %.2f s "
            "(%.1f generated tok/s)\n", n, (unsigned long long)prompt_sum, (unsigned long long)toks, dt, toks / dt);
    fprintf(stderr, "kaon-stats: {\"steps\": %llu, \"preemptions\": %llu, \"prefix_hit_tokens\": %llu, "
            "\"prefix_query_tokens\": %llu, \"prompt_tokens_computed\": %llu, \"generation_tokens\": %llu, "
            "\"kv_blocks_used\": %d, \"seconds\": %.3f, \"spec_drafts\": %llu, \"spec_draft_tokens\": %llu, "
            "\"spec_accepted_tokens\": %llu, \"prefill_steps\": %llu, \"prefill_step_seconds\": %.3f, "
            "\"decode_step_seconds\": %.3f, \"prefill_host_seconds\": %.3f, \"decode_host_seconds\": %.3f}\n",
            (unsigned long long)st.steps, (unsigned long long)st.preemptions,
            (unsigned long long)st.prefix_hit_tokens, (unsigned long long)st.prefix_queries_tokens,
            (unsigned long long)st.prompt_tokens, (unsigned long long)st.generation_tokens,
            st.kv_blocks_used, dt, (unsigned long long)st.spec_drafts, (unsigned long long)st.spec_draft_tokens,
            (unsigned long long)st.spec_accepted_tokens, (unsigned long long)stt.prefill_steps,
            stt.prefill_seconds, stt.decode_seconds, stt.prefill_host_seconds, stt.decode_host_seconds);
    if (eo.expert_stats) print_expert_load(e);
    rc = 0;
out:
    for (int i = 0; i < n; i++) {
        kaon_request_free(jobs[i].req);
        free(jobs[i].ids); free(jobs[i].text); free(jobs[i].out_ids); free(jobs[i].error);
    }
    if (n < cap) free(jobs[n].ids);
    free(jobs);
    free(line);
    if (in != stdin) fclose(in);
    kaon_engine_destroy(e);
    free(dummy_path);
    return rc;
}
