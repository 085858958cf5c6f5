// kaon bench serve|latency|throughput: benchmarks anyone can rerun.
//   serve       runs bench/serve.py (an OpenAI-compatible serving benchmark, vLLM's flags and
//               metrics) with the remaining arguments; the script is found through
//               $KAON_BENCH_DIR or next to the binary (../bench, ../../bench).
//   latency     a batch-size ladder through the engine API (no HTTP): B random prompts at once,
//               time to the last output, prefill time and per-step decode time.
//   throughput  N random prompts submitted at once (no HTTP), ignore EOS: requests/s and tokens/s
//               (vLLM's `bench throughput` figures).
// Both offline benchmarks take --load-format dummy with -m CONFIG (any bench/configs/*.json),
// --device cpu|cuda, draw a progress bar on stderr and write JSON with --output-json.
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/device.h"
#include "cli/cli.h"
#include "cli/load.h"
#include "kaon.h"
#include "util/timer.h"

// ---- finding bench/ and recording where a result came from ----------------------------------

static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

// The bench/ folder holding serve.py: $KAON_BENCH_DIR, else ../bench or ../../bench from the
// binary (a build folder inside the repository). Writes it into out; false when not found.
static bool find_bench_dir(char *out, size_t cap) {
    char p[PATH_MAX + 32];
    const char *env = getenv("KAON_BENCH_DIR");
    if (env && *env) {
        if (snprintf(p, sizeof p, "%s/serve.py", env) >= (int)sizeof p || !is_file(p)) return false;
        return snprintf(out, cap, "%s", env) < (int)cap;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return false;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return false;
    *slash = 0;
    static const char *const rel[] = {"/../bench", "/../../bench", "/../share/kaon/bench"};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        if (snprintf(p, sizeof p, "%s%s/serve.py", exe, rel[i]) >= (int)sizeof p || !is_file(p)) continue;
        char real[PATH_MAX];
        p[strlen(p) - strlen("/serve.py")] = 0;
        return snprintf(out, cap, "%s", realpath(p, real) ? real : p) < (int)cap;
    }
    return false;
}

// Appends s to buf, single-quoted for a POSIX shell when it needs quoting.
static void append_quoted(char **buf, size_t *len, size_t *cap, const char *s) {
    bool plain = *s != 0;
    for (const char *c = s; *c; c++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:=,@%+", *c)) plain = false;
    size_t need = *len + strlen(s) * 4 + 4;
    if (need > *cap) {
        *cap = need * 2;
        char *b = realloc(*buf, *cap);
        if (!b) return;
        *buf = b;
    }
    char *o = *buf + *len;
    if (*len) *o++ = ' ';
    if (plain) {
        o += sprintf(o, "%s", s);
    } else {
        *o++ = '\'';
        for (const char *c = s; *c; c++) {
            if (*c == '\'') { memcpy(o, "'\\''", 4); o += 4; }
            else *o++ = *c;
        }
        *o++ = '\'';
    }
    *o = 0;
    *len = (size_t)(o - *buf);
}

// "kaon bench <sub> args..." as a shell command line (malloc'd).
static char *command_line(const char *sub, int argc, char **argv) {
    size_t len = 0, cap = 256;
    char *buf = calloc(1, cap);
    if (!buf) return NULL;
    append_quoted(&buf, &len, &cap, "kaon");
    append_quoted(&buf, &len, &cap, "bench");
    append_quoted(&buf, &len, &cap, sub);
    for (int i = 1; i < argc; i++) append_quoted(&buf, &len, &cap, argv[i]);
    return buf;
}

// First line of a command's output (malloc'd), or NULL.
static char *run_line(const char *cmd) {
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    char line[512];
    char *r = fgets(line, sizeof line, f) ? strdup(line) : NULL;
    pclose(f);
    if (r) r[strcspn(r, "\r\n")] = 0;
    if (r && !*r) { free(r); r = NULL; }
    return r;
}

static char *git_commit(void) {
    char dir[PATH_MAX + 64];
    if (!find_bench_dir(dir, sizeof dir)) return NULL;
    char cmd[PATH_MAX + 192];
    if (snprintf(cmd, sizeof cmd, "git -C '%s/..' rev-parse --short HEAD 2>/dev/null", dir) >= (int)sizeof cmd)
        return NULL;
    return run_line(cmd);
}

// "host: CPU model, N cores, M GiB[, GPU]".
static void machine(char *out, size_t cap, bool gpu) {
    char host[256] = "?", cpu[256] = "?";
    gethostname(host, sizeof host - 1);
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(cpu, sizeof cpu, "%s", strchr(line, ':') + 2);
            cpu[strcspn(cpu, "\n")] = 0;
            break;
        }
    if (f) fclose(f);
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGE_SIZE);
    char *g = gpu ? run_line("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null") : NULL;
    snprintf(out, cap, "%s: %s, %ld cores, %.0f GiB%s%s", host, cpu, sysconf(_SC_NPROCESSORS_ONLN),
             (double)pages * (double)psize / 1073741824.0, g ? ", " : "", g ? g : "");
    free(g);
}

// ---- kaon bench serve -----------------------------------------------------------------------

static int bench_serve(int argc, char **argv) {
    char dir[PATH_MAX + 64];
    if (!find_bench_dir(dir, sizeof dir))
        return kaon_cli_fail("bench/serve.py not found next to the kaon binary; set KAON_BENCH_DIR to the "
                             "repository's bench folder");
    char script[PATH_MAX + 128], venv[PATH_MAX + 128];
    // Python: $KAON_PYTHON, else the repository's .venv (it has aiohttp), else python3.
    const char *py = getenv("KAON_PYTHON");
    if (snprintf(script, sizeof script, "%s/serve.py", dir) >= (int)sizeof script ||
        snprintf(venv, sizeof venv, "%s/../.venv/bin/python", dir) >= (int)sizeof venv)
        return kaon_cli_fail("path too long: %s", dir);
    if (!py || !*py) py = access(venv, X_OK) == 0 ? venv : "python3";
    char **args = calloc((size_t)argc + 2, sizeof *args);
    char *cmd = command_line("serve", argc, argv);
    if (!args || !cmd) return kaon_cli_fail("out of memory");
    args[0] = (char *)py;
    args[1] = script;
    for (int i = 1; i < argc; i++) args[i + 1] = argv[i];
    setenv("KAON_BENCH_PROG", "kaon bench serve", 1);
    setenv("KAON_BENCH_COMMAND", cmd, 1);
    fflush(NULL);
    execvp(py, args);
    int e = errno;
    free(args);
    free(cmd);
    return kaon_cli_fail("cannot run %s %s: %s", py, script, strerror(e));
}

// ---- the offline benchmarks -----------------------------------------------------------------

typedef struct bench_opts {
    kaon_engine_options eo;
    bool dummy, quiet;
    const char *model_arg, *output_json;
    uint64_t seed;
    // latency
    int input_len, output_len, num_iters, num_warmup;
    int batch_sizes[32], n_batch_sizes;
    // throughput
    int num_prompts;
    double range_ratio;
} bench_opts;

typedef struct run_req {
    kaon_request *r;
    int32_t *ids;
    int n_ids, out_tokens, prompt_tokens;
    double t_submit;  // when submitted (s since the batch started)
    double t_first;   // when its first token was sampled, by the engine's clock (s since the batch started; 0: none)
    bool done, failed;
    char *error;
} run_req;

static uint64_t rng_next(uint64_t *s) {  // splitmix64
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// A progress bar on stderr; when stderr is not a terminal, one line every 10 s instead.
static void progress(const char *label, int done, int total, uint64_t toks, double t0, bool quiet) {
    static double last_line;
    if (quiet) return;
    const bool tty = isatty(2);
    double dt = kaon_now() - t0;
    if (!tty && done < total && kaon_now() - last_line < 10.0) return;
    last_line = kaon_now();
    int w = 30, fill = total ? done * w / total : w;
    char bar[64];
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = 0;
    fprintf(stderr, "%s%s [%s] %d/%d requests, %llu tokens, %.1f tok/s, %.1f s %s", tty ? "\r" : "", label, bar, done,
            total, (unsigned long long)toks, dt > 0 ? toks / dt : 0.0, dt, tty ? "" : "\n");
}

typedef struct batch_state {
    int n, done;
    uint64_t toks;
    double t0;
    double t_all_first;  // when the last sequence got its first token (s since t0)
} batch_state;

// Takes one output of request q into the batch's accounting. First-token times come from the
// engine (kaon_output.first_token_time), not from when this thread saw them: this thread may
// run late when the engine's threads hold every core.
static void absorb(batch_state *b, run_req *q, const kaon_output *ko) {
    b->toks += (uint64_t)ko->n_tokens;
    q->out_tokens = ko->completion_tokens;
    q->prompt_tokens = ko->prompt_tokens;
    if (ko->n_tokens > 0 && q->t_first == 0)
        q->t_first = ko->first_token_time > 0 ? q->t_submit + ko->first_token_time : kaon_now() - b->t0;
    if ((ko->finish == KAON_FINISH_ERROR || ko->finish == KAON_FINISH_ABORT) && !q->failed) {
        q->failed = true;
        q->error = strdup(ko->error ? ko->error : "aborted");
    }
    if (ko->finished) {
        q->done = true;
        b->done++;
    }
}

static void fail_req(batch_state *b, run_req *q, const char *msg) {
    q->done = q->failed = true;
    q->error = strdup(msg ? msg : "failed");
    b->done++;
}

// Submits n random prompts (lengths in[i]) asking out[i] tokens each, waits for all of them.
// Fills reqs and *bs; returns the seconds from the first submit to the last output.
static double run_batch(kaon_engine *e, const bench_opts *o, uint64_t *rng, int n, const int *in, const int *out,
                        run_req *reqs, const char *label, batch_state *bs) {
    kaon_engine_info info;
    kaon_engine_get_info(e, &info);
    const int vocab = info.vocab_size > 0 ? info.vocab_size : 32000;
    memset(reqs, 0, sizeof *reqs * (size_t)n);
    memset(bs, 0, sizeof *bs);
    bs->n = n;
    for (int i = 0; i < n; i++) {
        reqs[i].n_ids = in[i];
        reqs[i].ids = malloc(sizeof(int32_t) * (size_t)in[i]);
        for (int k = 0; reqs[i].ids && k < in[i]; k++) reqs[i].ids[k] = (int32_t)(rng_next(rng) % (uint64_t)vocab);
    }
    kaon_sampling sp;
    kaon_sampling_default(&sp);
    sp.temperature = 0;
    sp.ignore_eos = true;
    bs->t0 = kaon_now();
    for (int i = 0; i < n; i++) {
        sp.max_tokens = out[i];
        reqs[i].t_submit = kaon_now() - bs->t0;
        reqs[i].r = reqs[i].ids ? kaon_engine_submit(e, reqs[i].ids, reqs[i].n_ids, &sp) : NULL;
        if (!reqs[i].r) fail_req(bs, &reqs[i], reqs[i].ids ? kaon_last_error() : "out of memory");
    }
    double last_draw = 0;
    while (bs->done < n) {
        bool progressed = false;
        int first_open = -1;
        for (int i = 0; i < n; i++) {
            run_req *q = &reqs[i];
            kaon_output ko;
            while (!q->done) {
                int rc = kaon_request_next(q->r, &ko, 0);
                if (rc == 0) break;
                if (rc < 0) fail_req(bs, q, kaon_last_error());
                else absorb(bs, q, &ko);
                progressed = true;
            }
            if (!q->done && first_open < 0) first_open = i;
        }
        if (kaon_now() - last_draw > 0.2) {
            progress(label, bs->done, n, bs->toks, bs->t0, o->quiet);
            last_draw = kaon_now();
        }
        if (!progressed && first_open >= 0) {  // nothing ready: wait a little on one request
            kaon_output ko;
            int rc = kaon_request_next(reqs[first_open].r, &ko, 20);
            if (rc == 1) absorb(bs, &reqs[first_open], &ko);
            else if (rc < 0) fail_req(bs, &reqs[first_open], kaon_last_error());
        }
    }
    double dt = kaon_now() - bs->t0;
    for (int i = 0; i < n; i++)
        if (reqs[i].t_first > bs->t_all_first) bs->t_all_first = reqs[i].t_first;
    progress(label, bs->done, n, bs->toks, bs->t0, o->quiet);
    if (!o->quiet && isatty(2)) fputc('\n', stderr);
    return dt;
}

static int count_failed(run_req *reqs, int n, const char **first_error) {
    int f = 0;
    *first_error = NULL;
    for (int i = 0; i < n; i++)
        if (reqs[i].failed) {
            if (!*first_error) *first_error = reqs[i].error;
            f++;
        }
    return f;
}

static void free_reqs(run_req *reqs, int n) {
    for (int i = 0; i < n; i++) {
        kaon_request_free(reqs[i].r);
        free(reqs[i].ids);
        free(reqs[i].error);
        reqs[i].r = NULL;
        reqs[i].ids = NULL;
        reqs[i].error = NULL;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// numpy.percentile's linear interpolation over sorted v[0..n).
static double pct(const double *v, int n, double p) {
    if (n <= 0) return 0;
    double k = (n - 1) * p / 100.0;
    int lo = (int)k, hi = lo + 1 < n ? lo + 1 : n - 1;
    return v[lo] + (v[hi] - v[lo]) * (k - lo);
}

static cJSON *header_json(const char *kind, const bench_opts *o, int argc, char **argv) {
    cJSON *j = cJSON_CreateObject();
    char date[64], mach[1024];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", localtime(&now));
    kaon_device dev;
    machine(mach, sizeof mach, !kaon_device_parse(o->eo.device, &dev) && dev.kind == KAON_DEVICE_CUDA);
    char *commit = git_commit(), *cmd = command_line(kind, argc, argv);
    cJSON_AddStringToObject(j, "benchmark", kind);
    cJSON_AddStringToObject(j, "date", date);
    if (commit) cJSON_AddStringToObject(j, "commit", commit);
    else cJSON_AddNullToObject(j, "commit");
    cJSON_AddStringToObject(j, "machine", mach);
    const char *slash = strrchr(o->model_arg, '/');
    cJSON_AddStringToObject(j, "model", slash && slash[1] ? slash + 1 : o->model_arg);
    cJSON_AddStringToObject(j, "model_path", o->model_arg);
    cJSON_AddStringToObject(j, "load_format", o->dummy ? "dummy" : "auto");
    cJSON_AddStringToObject(j, "device", o->eo.device ? o->eo.device : "cpu");
    cJSON_AddNumberToObject(j, "threads", o->eo.n_threads);
    cJSON_AddStringToObject(j, "command", cmd ? cmd : "");
    free(commit);
    free(cmd);
    return j;
}

static int write_json(const char *path, cJSON *j) {
    char *s = cJSON_Print(j);
    if (!s) return kaon_cli_fail("out of memory");
    FILE *f = !strcmp(path, "-") ? stdout : fopen(path, "w");
    if (!f) {
        free(s);
        return kaon_cli_fail("cannot write %s: %s", path, strerror(errno));
    }
    fprintf(f, "%s\n", s);
    if (f != stdout) {
        fclose(f);
        fprintf(stderr, "kaon: bench: results in %s\n", path);
    }
    free(s);
    return 0;
}

static int bench_latency(kaon_engine *e, const bench_opts *o, int argc, char **argv) {
    int maxb = 0;
    for (int i = 0; i < o->n_batch_sizes; i++) maxb = o->batch_sizes[i] > maxb ? o->batch_sizes[i] : maxb;
    run_req *reqs = calloc((size_t)maxb, sizeof *reqs);
    int *in = calloc((size_t)maxb, sizeof(int)), *out = calloc((size_t)maxb, sizeof(int));
    double *lat = malloc(sizeof(double) * (size_t)(o->num_iters > 0 ? o->num_iters : 1));
    if (!reqs || !in || !out || !lat) return kaon_cli_fail("out of memory");
    for (int i = 0; i < maxb; i++) in[i] = o->input_len, out[i] = o->output_len;
    uint64_t rng = o->seed;
    cJSON *j = header_json("latency", o, argc, argv);
    cJSON_AddNumberToObject(j, "input_len", o->input_len);
    cJSON_AddNumberToObject(j, "output_len", o->output_len);
    cJSON_AddNumberToObject(j, "num_iters", o->num_iters);
    cJSON_AddNumberToObject(j, "num_iters_warmup", o->num_warmup);
    cJSON *arr = cJSON_AddArrayToObject(j, "results");
    int rc = 0, total_failed = 0;
    printf("%6s %12s %10s %10s %12s %16s %14s %8s\n", "batch", "latency (s)", "p50 (s)", "p90 (s)", "prefill (s)",
           "decode step (ms)", "decode tok/s", "failed");
    for (int bi = 0; bi < o->n_batch_sizes; bi++) {
        const int B = o->batch_sizes[bi];
        double prefill_sum = 0, step_sum = 0;
        int steps_n = 0, failed = 0;
        char *first_err = NULL;
        char label[64];
        for (int it = -o->num_warmup; it < o->num_iters; it++) {
            snprintf(label, sizeof label, "batch %d %s %d", B, it < 0 ? "warm-up" : "iter", it < 0 ? it + o->num_warmup + 1 : it + 1);
            batch_state bs;
            double dt = run_batch(e, o, &rng, B, in, out, reqs, label, &bs);
            const double t_all_first = bs.t_all_first;
            const char *fe;
            int f = count_failed(reqs, B, &fe);
            if (it >= 0) {
                lat[it] = dt;
                failed += f;
                if (fe && !first_err) {
                    first_err = strdup(fe);
                    fprintf(stderr, "kaon: bench: batch %d: request failed: %s\n", B, fe);
                }
                prefill_sum += t_all_first;
                // Decode: once every sequence has its first token, each step gives each one
                // token, so the last one needs output_len - 1 more steps.
                if (o->output_len > 1 && t_all_first > 0 && dt > t_all_first) {
                    step_sum += (dt - t_all_first) / (double)(o->output_len - 1);
                    steps_n++;
                }
            }
            free_reqs(reqs, B);
        }
        total_failed += failed;
        double sorted[1024];
        int n = o->num_iters < 1024 ? o->num_iters : 1024;
        double avg = 0;
        for (int i = 0; i < n; i++) sorted[i] = lat[i], avg += lat[i];
        avg /= n > 0 ? n : 1;
        qsort(sorted, (size_t)n, sizeof *sorted, cmp_double);
        double step_ms = steps_n ? step_sum / steps_n * 1000.0 : 0;
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "batch_size", B);
        cJSON_AddNumberToObject(r, "avg_latency", avg);
        cJSON *ls = cJSON_AddArrayToObject(r, "latencies");
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(ls, cJSON_CreateNumber(lat[i]));
        cJSON *ps = cJSON_AddObjectToObject(r, "percentiles");
        static const int P[] = {10, 25, 50, 75, 90, 99};
        for (size_t k = 0; k < sizeof P / sizeof P[0]; k++) {
            char key[8];
            snprintf(key, sizeof key, "%d", P[k]);
            cJSON_AddNumberToObject(ps, key, pct(sorted, n, P[k]));
        }
        cJSON_AddNumberToObject(r, "avg_prefill_s", n ? prefill_sum / n : 0);
        cJSON_AddNumberToObject(r, "avg_decode_step_ms", step_ms);
        cJSON_AddNumberToObject(r, "decode_tokens_per_s", step_ms > 0 ? B * 1000.0 / step_ms : 0);
        cJSON_AddNumberToObject(r, "output_tokens_per_s", avg > 0 ? (double)B * o->output_len / avg : 0);
        cJSON_AddNumberToObject(r, "failed", failed);
        if (first_err) cJSON_AddStringToObject(r, "first_error", first_err);
        free(first_err);
        cJSON_AddItemToArray(arr, r);
        printf("%6d %12.4f %10.4f %10.4f %12.4f %16.3f %14.1f %8d\n", B, avg, pct(sorted, n, 50), pct(sorted, n, 90),
               n ? prefill_sum / n : 0, step_ms, step_ms > 0 ? B * 1000.0 / step_ms : 0, failed);
        fflush(stdout);
    }
    if (o->n_batch_sizes == 1) {  // vLLM's flat keys for a single batch size
        cJSON *r = cJSON_GetArrayItem(arr, 0);
        cJSON_AddItemToObject(j, "avg_latency", cJSON_Duplicate(cJSON_GetObjectItem(r, "avg_latency"), 1));
        cJSON_AddItemToObject(j, "latencies", cJSON_Duplicate(cJSON_GetObjectItem(r, "latencies"), 1));
        cJSON_AddItemToObject(j, "percentiles", cJSON_Duplicate(cJSON_GetObjectItem(r, "percentiles"), 1));
    }
    cJSON_AddNumberToObject(j, "failed", total_failed);
    if (total_failed) fprintf(stderr, "kaon: bench: %d requests FAILED\n", total_failed);
    if (o->output_json) rc = write_json(o->output_json, j);
    cJSON_Delete(j);
    free(reqs);
    free(in);
    free(out);
    free(lat);
    return rc ? rc : (total_failed ? 1 : 0);
}

static int bench_throughput(kaon_engine *e, const bench_opts *o, int argc, char **argv) {
    const int n = o->num_prompts;
    run_req *reqs = calloc((size_t)n, sizeof *reqs);
    int *in = calloc((size_t)n, sizeof(int)), *out = calloc((size_t)n, sizeof(int));
    if (!reqs || !in || !out) return kaon_cli_fail("out of memory");
    uint64_t rng = o->seed;
    // Lengths uniform in [len * (1 - r), len * (1 + r)] as vLLM's random dataset.
    int lo_in = (int)(o->input_len * (1 - o->range_ratio)), hi_in = (int)(o->input_len * (1 + o->range_ratio) + 0.999);
    int lo_out = (int)(o->output_len * (1 - o->range_ratio)), hi_out = (int)(o->output_len * (1 + o->range_ratio) + 0.999);
    for (int i = 0; i < n; i++) {
        in[i] = lo_in + (int)(rng_next(&rng) % (uint64_t)(hi_in - lo_in + 1));
        out[i] = lo_out + (int)(rng_next(&rng) % (uint64_t)(hi_out - lo_out + 1));
        if (in[i] < 1) in[i] = 1;
        if (out[i] < 1) out[i] = 1;
    }
    kaon_engine_stats st0, st1;
    kaon_engine_get_stats(e, &st0);
    batch_state bs;
    double dt = run_batch(e, o, &rng, n, in, out, reqs, "throughput", &bs);
    kaon_engine_get_stats(e, &st1);
    const char *first_err;
    int failed = count_failed(reqs, n, &first_err);
    uint64_t ptoks = 0, otoks = 0;
    for (int i = 0; i < n; i++) {
        if (reqs[i].failed) continue;
        ptoks += (uint64_t)reqs[i].n_ids;
        otoks += (uint64_t)reqs[i].out_tokens;
    }
    cJSON *j = header_json("throughput", o, argc, argv);
    cJSON_AddNumberToObject(j, "input_len", o->input_len);
    cJSON_AddNumberToObject(j, "output_len", o->output_len);
    cJSON_AddNumberToObject(j, "range_ratio", o->range_ratio);
    cJSON_AddNumberToObject(j, "max_num_seqs", o->eo.max_num_seqs);
    cJSON_AddNumberToObject(j, "elapsed_time", dt);
    cJSON_AddNumberToObject(j, "num_requests", n);
    cJSON_AddNumberToObject(j, "completed", n - failed);
    cJSON_AddNumberToObject(j, "failed", failed);
    if (first_err) cJSON_AddStringToObject(j, "first_error", first_err);
    cJSON_AddNumberToObject(j, "total_num_tokens", (double)(ptoks + otoks));
    cJSON_AddNumberToObject(j, "total_prompt_tokens", (double)ptoks);
    cJSON_AddNumberToObject(j, "total_output_tokens", (double)otoks);
    cJSON_AddNumberToObject(j, "requests_per_second", (n - failed) / dt);
    cJSON_AddNumberToObject(j, "tokens_per_second", (double)(ptoks + otoks) / dt);
    cJSON_AddNumberToObject(j, "output_tokens_per_second", (double)otoks / dt);
    cJSON_AddNumberToObject(j, "steps", (double)(st1.steps - st0.steps));
    cJSON_AddNumberToObject(j, "preemptions", (double)(st1.preemptions - st0.preemptions));
    cJSON_AddNumberToObject(j, "prefix_hit_tokens", (double)(st1.prefix_hit_tokens - st0.prefix_hit_tokens));
    printf("Throughput: %.2f requests/s, %.2f total tokens/s, %.2f output tokens/s\n", (n - failed) / dt,
           (double)(ptoks + otoks) / dt, (double)otoks / dt);
    printf("Total num prompt tokens:  %llu\nTotal num output tokens:  %llu\nElapsed: %.2f s; %d requests, %d failed; "
           "%llu engine steps, %llu preemptions\n",
           (unsigned long long)ptoks, (unsigned long long)otoks, dt, n, failed,
           (unsigned long long)(st1.steps - st0.steps), (unsigned long long)(st1.preemptions - st0.preemptions));
    if (failed) fprintf(stderr, "kaon: bench: %d of %d requests FAILED; first error: %s\n", failed, n, first_err ? first_err : "?");
    int rc = o->output_json ? write_json(o->output_json, j) : 0;
    cJSON_Delete(j);
    free_reqs(reqs, n);
    free(reqs);
    free(in);
    free(out);
    return rc ? rc : (failed ? 1 : 0);
}

static void usage_offline(const char *sub) {
    bool lat = !strcmp(sub, "latency");
    printf("usage: kaon bench %s [-m MODEL | --load-format dummy -m CONFIG] [options]\n", sub);
    if (lat)
        printf("Runs B random prompts at once for each B of a ladder and times them through the engine (no HTTP):\n"
               "latency of the batch, prefill (every sequence has a token) and the per-step decode time after it.\n"
               "  --batch-sizes 1,2,4,...   the ladder (default 1,2,4,8,16,32,64)\n"
               "  --input-len N (32)  --output-len N (128)  --num-iters N (3)  --num-iters-warmup N (1)\n");
    else
        printf("Submits N random prompts at once through the engine (no HTTP), ignoring EOS: requests/s and tokens/s.\n"
               "  --num-prompts N (256)  --input-len N (128)  --output-len N (128)\n"
               "  --random-range-ratio R (0: lengths uniform in [len*(1-R), len*(1+R)])\n");
    printf("  -m, --model PATH        GGUF file, HF folder, or with --load-format dummy a config.json or its folder\n"
           "  --load-format auto|dummy  dummy: random weights of the config's shapes (no weight files)\n"
           "  --device cpu|cuda|cuda:N|noop  --threads N  -tp N  --max-num-seqs N  --max-num-batched-tokens N\n"
           "  --max-model-len N  --kv-cache-memory MIB  --gpu-memory-utilization F  --no-prefix-caching\n"
           "  --kv-cache-dtype T (" KAON_CLI_KV_DTYPE_HELP ")\n"
           "  --speculative-config JSON (" KAON_CLI_SPEC_HELP ")\n"
           "  --seed S  --output-json FILE (results; '-' for stdout)  --quiet (no progress bar)\n");
}

static int parse_ladder(const char *s, bench_opts *o) {
    o->n_batch_sizes = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 65536 || o->n_batch_sizes == 32) return -1;
        o->batch_sizes[o->n_batch_sizes++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return o->n_batch_sizes ? 0 : -1;
}

static int bench_offline(const char *sub, int argc, char **argv) {
    bench_opts o;
    memset(&o, 0, sizeof o);
    kaon_engine_options_default(&o.eo);
    const bool lat = !strcmp(sub, "latency");
    o.input_len = lat ? 32 : 128;
    o.output_len = 128;
    o.num_iters = 3;
    o.num_warmup = 1;
    o.num_prompts = 256;
    o.seed = 0;
    parse_ladder("1,2,4,8,16,32,64", &o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        double d;
        bool flag = !strcmp(a, "--quiet") || !strcmp(a, "--no-prefix-caching") || !strcmp(a, "--enable-expert-parallel") ||
                    !strcmp(a, "-h") || !strcmp(a, "--help");
        if (!flag && !v) return kaon_cli_fail("option %s needs a value (see kaon bench %s --help)", a, sub);
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage_offline(sub); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { o.model_arg = v; i++; }
        else if (!strcmp(a, "--load-format") && (!strcmp(v, "auto") || !strcmp(v, "dummy"))) { o.dummy = !strcmp(v, "dummy"); i++; }
        else if (!strcmp(a, "--device")) { if (kaon_cli_check_device(v, true)) return 2; o.eo.device = v; i++; }
        else if (!strcmp(a, "--threads") && kaon_cli_parse_int(v, 1, 4096, &l)) { o.eo.n_threads = (int)l; i++; }
        else if ((!strcmp(a, "--tensor-parallel-size") || !strcmp(a, "-tp")) && kaon_cli_parse_int(v, 1, 64, &l)) { o.eo.tensor_parallel_size = (int)l; i++; }
        else if (!strcmp(a, "--enable-expert-parallel")) o.eo.enable_expert_parallel = true;
        else if ((!strcmp(a, "--data-parallel-size") || !strcmp(a, "-dp")) && kaon_cli_parse_int(v, 1, 64, &l)) { o.eo.data_parallel_size = (int)l; i++; }
        else if (!strcmp(a, "--max-num-seqs") && kaon_cli_parse_int(v, 1, 65536, &l)) { o.eo.max_num_seqs = (int)l; i++; }
        else if (!strcmp(a, "--max-num-batched-tokens") && kaon_cli_parse_int(v, 1, 1 << 20, &l)) { o.eo.max_num_batched_tokens = (int)l; i++; }
        else if (!strcmp(a, "--max-model-len") && kaon_cli_parse_int(v, 2, 1 << 24, &l)) { o.eo.max_model_len = (int)l; i++; }
        else if (!strcmp(a, "--kv-cache-memory") && kaon_cli_parse_float(v, 0.001, 1 << 22, &d)) { o.eo.kv_cache_memory = (size_t)(d * 1048576.0); i++; }
        else if (!strcmp(a, "--gpu-memory-utilization") && kaon_cli_parse_float(v, 0.01, 1, &d)) { o.eo.gpu_memory_utilization = d; i++; }
        else if (!strcmp(a, "--no-prefix-caching")) o.eo.disable_prefix_caching = true;
        else if (!strcmp(a, "--kv-cache-dtype") && v) { if (kaon_cli_check_kv_dtype(v)) return 2; o.eo.kv_cache_dtype = v; i++; }
        else if (!strcmp(a, "--speculative-config")) { if (kaon_cli_parse_spec_config(v, &o.eo.speculative)) return 2; i++; }
        else if (!strcmp(a, "--quiet")) o.quiet = true;
        else if (!strcmp(a, "--seed") && kaon_cli_parse_int(v, 0, 0x7fffffffffffffffL, &l)) { o.seed = (uint64_t)l; i++; }
        else if (!strcmp(a, "--output-json")) { o.output_json = v; i++; }
        else if (!strcmp(a, "--input-len") && kaon_cli_parse_int(v, 1, 1 << 24, &l)) { o.input_len = (int)l; i++; }
        else if (!strcmp(a, "--output-len") && kaon_cli_parse_int(v, 1, 1 << 24, &l)) { o.output_len = (int)l; i++; }
        else if (lat && !strcmp(a, "--batch-sizes") && !parse_ladder(v, &o)) i++;
        else if (lat && !strcmp(a, "--batch-size") && !parse_ladder(v, &o)) i++;
        else if (lat && !strcmp(a, "--num-iters") && kaon_cli_parse_int(v, 1, 1000, &l)) { o.num_iters = (int)l; i++; }
        else if (lat && !strcmp(a, "--num-iters-warmup") && kaon_cli_parse_int(v, 0, 1000, &l)) { o.num_warmup = (int)l; i++; }
        else if (!lat && !strcmp(a, "--num-prompts") && kaon_cli_parse_int(v, 1, 1 << 22, &l)) { o.num_prompts = (int)l; i++; }
        else if (!lat && !strcmp(a, "--random-range-ratio") && kaon_cli_parse_float(v, 0, 0.999, &d)) { o.range_ratio = d; i++; }
        else return kaon_cli_fail("bad option or value: %s %s (see kaon bench %s --help)", a, v ? v : "", sub);
    }
    if (o.dummy && !o.model_arg) return kaon_cli_fail("--load-format dummy needs -m CONFIG (e.g. bench/configs/*.json)");
    if (!o.model_arg) o.model_arg = kaon_cli_default_model();
    if (!o.model_arg) return kaon_cli_fail("no model given (-m) and the default model is missing");
    char *spec = NULL;
    if (o.dummy) {  // the model loader reads "dummy:<config>" as a model of random weights
        size_t n = strlen(o.model_arg) + 8;
        spec = malloc(n);
        if (!spec) return kaon_cli_fail("out of memory");
        snprintf(spec, n, "dummy:%s", o.model_arg);
    }
    o.eo.model = spec ? spec : o.model_arg;
    o.eo.load_tokenizer = false;  // prompts are token ids; no text is needed
    int maxb = o.num_prompts;
    if (lat) {
        maxb = 0;
        for (int i = 0; i < o.n_batch_sizes; i++) maxb = o.batch_sizes[i] > maxb ? o.batch_sizes[i] : maxb;
    }
    if (!o.eo.max_num_seqs) o.eo.max_num_seqs = lat ? maxb : (maxb < 256 ? maxb : 256);
    if (!o.eo.max_model_len) o.eo.max_model_len = 0;  // the engine's choice, capped by its pool
    if (!o.quiet) fprintf(stderr, "kaon: bench %s: loading %s%s on %s\n", sub, o.dummy ? "dummy weights for " : "",
                          o.model_arg, o.eo.device ? o.eo.device : "cpu");
    double t0 = kaon_now();
    kaon_engine *e = kaon_engine_create(&o.eo);
    if (!e) {
        free(spec);
        return kaon_cli_fail("%s", kaon_last_error());
    }
    kaon_cli_follow_if_follower(e);
    if (!o.quiet) {
        kaon_engine_info info;
        kaon_engine_get_info(e, &info);
        fprintf(stderr, "kaon: bench %s: engine ready in %.1f s (%s, vocab %d, max_model_len %d, %d KV blocks x %d)\n",
                sub, kaon_now() - t0, info.arch ? info.arch : "?", info.vocab_size, info.max_model_len, info.kv_blocks,
                info.block_size);
    }
    int rc = lat ? bench_latency(e, &o, argc, argv) : bench_throughput(e, &o, argc, argv);
    kaon_engine_destroy(e);
    free(spec);
    return rc;
}

static void usage(FILE *f) {
    fprintf(f, "usage: kaon bench <serve|latency|throughput> [options]\n"
               "  serve       a serving benchmark against any OpenAI-compatible server (bench/serve.py;\n"
               "              vLLM's `bench serve` flags and metrics; --max-concurrency 1,4,16 sweeps)\n"
               "  latency     batch-size ladder through the engine: batch latency, prefill, per-step decode\n"
               "  throughput  N random prompts at once through the engine: requests/s, tokens/s\n"
               "Run 'kaon bench <command> --help' for its options.\n");
}

int kaon_cmd_bench(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "-h") || !strcmp(sub, "--help") || !strcmp(sub, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(sub, "serve")) return bench_serve(argc - 1, argv + 1);
    if (!strcmp(sub, "latency") || !strcmp(sub, "throughput")) return bench_offline(sub, argc - 1, argv + 1);
    usage(stderr);
    return kaon_cli_fail("unknown bench command '%s'", sub);
}
