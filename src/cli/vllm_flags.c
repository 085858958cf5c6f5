// vLLM's `vllm serve` flags -> `kaon serve`'s (vllm_flags.h; the table in docs/API.md).
#include "cli/vllm_flags.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "model/quant_config.h"
#include "util/err.h"

typedef enum {
    VF_KAON,     // kaon's flag (to: its kaon name when vLLM spells it differently)
    VF_ACCEPT,   // asks for what kaon does anyway: dropped without a word
    VF_IGNORE,   // no kaon meaning, harmless: dropped with a warning (why)
    VF_REFUSE,   // would change what is served and kaon cannot: an error (why)
    VF_ONLY,     // accepted when the value is one of to ("1" or "auto,generate"), else refused (why)
    VF_SPECIAL,  // handled in translate() by name
} vf_kind;

typedef struct {
    const char *name;
    vf_kind kind;
    int arity;  // 0: a switch; 1: one value; 2: one or more values (vLLM's nargs="+")
    const char *to;
    const char *why;
} vf_entry;

#define NOT_YET_18 "not yet: kaon runs one model on one device (see issue 18)"

static const vf_entry table[] = {
    // kaon's own flags (vLLM spells most of them the same way).
    {"-h", VF_KAON, 0, NULL, NULL},
    {"--help", VF_KAON, 0, NULL, NULL},
    {"-m", VF_KAON, 1, NULL, NULL},
    {"--model", VF_KAON, 1, NULL, NULL},
    {"--host", VF_KAON, 1, NULL, NULL},
    {"--port", VF_KAON, 1, NULL, NULL},
    {"--api-key", VF_KAON, 1, NULL, NULL},
    {"--max-num-seqs", VF_KAON, 1, NULL, NULL},
    {"--max-num-batched-tokens", VF_SPECIAL, 1, NULL, NULL},
    {"--gpu-memory-utilization", VF_KAON, 1, NULL, NULL},
    {"--kv-cache-memory", VF_KAON, 1, NULL, NULL},
    {"--device", VF_KAON, 1, NULL, NULL},
    {"--load-format", VF_KAON, 1, NULL, NULL},
    {"-t", VF_KAON, 1, NULL, NULL},
    {"--threads", VF_KAON, 1, NULL, NULL},
    {"--block-size", VF_KAON, 1, NULL, NULL},
    {"--no-prefix-caching", VF_KAON, 0, NULL, NULL},
    {"--enable-prefix-caching", VF_KAON, 0, NULL, NULL},
    {"--no-enable-prefix-caching", VF_KAON, 0, "--no-prefix-caching", NULL},
    {"--expert-stats", VF_KAON, 0, NULL, NULL},
    {"--enable-expert-parallel", VF_KAON, 0, NULL, NULL},
    {"--speculative-config", VF_KAON, 1, NULL, NULL},
    {"--chat-template", VF_KAON, 1, NULL, NULL},
    {"--tool-call-parser", VF_KAON, 1, NULL, NULL},
    {"--reasoning-parser", VF_KAON, 1, NULL, NULL},
    {"--max-body-size", VF_KAON, 1, NULL, NULL},
    {"--max-connections", VF_KAON, 1, NULL, NULL},
    {"--max-queue", VF_KAON, 1, NULL, NULL},
    {"--max-prompt-tokens", VF_KAON, 1, NULL, NULL},
    {"--max-tokens", VF_KAON, 1, NULL, NULL},
    {"--max-n", VF_KAON, 1, NULL, NULL},
    {"--request-timeout", VF_KAON, 1, NULL, NULL},
    {"--drain-timeout", VF_KAON, 1, NULL, NULL},
    {"--port-file", VF_KAON, 1, NULL, NULL},
    {"--plugin", VF_KAON, 1, NULL, NULL},  // kaon's: main.c loads it before serve parses (cli/plugins.c)
    // vLLM's flags with a value rewritten here.
    {"--max-model-len", VF_SPECIAL, 1, NULL, NULL},
    {"--kv-cache-memory-bytes", VF_SPECIAL, 1, "--kv-cache-memory", NULL},
    {"--kv-cache-dtype", VF_SPECIAL, 1, NULL, NULL},
    {"--served-model-name", VF_SPECIAL, 2, NULL, NULL},
    {"--dtype", VF_SPECIAL, 1, NULL, NULL},
    {"-q", VF_SPECIAL, 1, NULL, NULL},
    {"--quantization", VF_SPECIAL, 1, NULL, NULL},
    {"--tokenizer", VF_SPECIAL, 1, NULL, NULL},
    {"--enforce-eager", VF_SPECIAL, 0, NULL, NULL},
    // Accepted: what kaon does anyway.
    {"--enable-auto-tool-choice", VF_ACCEPT, 0, NULL, NULL},
    {"--disable-log-requests", VF_ACCEPT, 0, NULL, NULL},
    {"--disable-log-stats", VF_ACCEPT, 0, NULL, NULL},
    {"--disable-uvicorn-access-log", VF_ACCEPT, 0, NULL, NULL},
    {"--disable-fastapi-docs", VF_ACCEPT, 0, NULL, NULL},
    {"--disable-frontend-multiprocessing", VF_ACCEPT, 0, NULL, NULL},
    {"--disable-custom-all-reduce", VF_ACCEPT, 0, NULL, NULL},
    {"--enable-chunked-prefill", VF_ACCEPT, 0, NULL, NULL},
    {"--use-tqdm-on-load", VF_ACCEPT, 0, NULL, NULL},
    // Only the value kaon has.
    {"-tp", VF_KAON, 1, "--tensor-parallel-size", NULL},
    {"--tensor-parallel-size", VF_KAON, 1, NULL, NULL},
    {"-pp", VF_ONLY, 1, "1", NOT_YET_18},
    {"--pipeline-parallel-size", VF_ONLY, 1, "1", NOT_YET_18},
    // kaon's --data-parallel-size: engine replicas, or DP attention with --enable-expert-parallel.
    {"-dp", VF_KAON, 1, "--data-parallel-size", NULL},
    {"--data-parallel-size", VF_KAON, 1, NULL, NULL},
    {"-dcp", VF_ONLY, 1, "1", NOT_YET_18},
    {"--decode-context-parallel-size", VF_ONLY, 1, "1", NOT_YET_18},
    {"--api-server-count", VF_ONLY, 1, "1", "kaon's HTTP front end is one process with a thread pool"},
    {"--task", VF_ONLY, 1, "auto,generate", "kaon serves generative models only"},
    {"--runner", VF_ONLY, 1, "auto,generate", "kaon serves generative models only"},
    {"--tokenizer-mode", VF_ONLY, 1, "auto,hf", "kaon reads the model's tokenizer.json (or the GGUF's vocabulary)"},
    {"--config-format", VF_ONLY, 1, "auto,hf", "kaon reads config.json (or the GGUF's metadata)"},
    {"--model-impl", VF_ONLY, 1, "auto", "kaon runs its own implementation of each architecture"},
    {"--generation-config", VF_ONLY, 1, "auto", "kaon reads the model's generation_config.json"},
    {"--scheduling-policy", VF_ONLY, 1, "fcfs", "kaon schedules first come, first served"},
    // Ignored with a warning.
    {"--trust-remote-code", VF_IGNORE, 0, NULL, "kaon runs no model code"},
    {"--swap-space", VF_IGNORE, 1, NULL, "kaon has no CPU swap: a preempted sequence's blocks are freed and recomputed"},
    {"--cpu-offload-gb", VF_IGNORE, 1, NULL, "kaon does not offload weights"},
    {"--download-dir", VF_IGNORE, 1, NULL, "kaon downloads nothing: MODEL is a local path"},
    {"--revision", VF_IGNORE, 1, NULL, "kaon downloads nothing: MODEL is a local path"},
    {"--code-revision", VF_IGNORE, 1, NULL, "kaon runs no model code"},
    {"--tokenizer-revision", VF_IGNORE, 1, NULL, "kaon downloads nothing: MODEL is a local path"},
    {"--seed", VF_IGNORE, 1, NULL, "requests without a seed are sampled from a random one; pass seed per request"},
    {"--max-logprobs", VF_IGNORE, 1, NULL, "kaon's limit is 20 (logprobs, top_logprobs, prompt_logprobs)"},
    {"--uvicorn-log-level", VF_IGNORE, 1, NULL, "kaon's log level is KAON_LOG (debug, info, warn, error)"},
    {"--enable-log-requests", VF_IGNORE, 0, NULL, "kaon logs requests at KAON_LOG=debug only"},
    {"--limit-mm-per-prompt", VF_IGNORE, 1, NULL, "kaon serves text models"},
    {"--mm-processor-kwargs", VF_IGNORE, 1, NULL, "kaon serves text models"},
    {"--allowed-local-media-path", VF_IGNORE, 1, NULL, "kaon serves text models"},
    {"--max-seq-len-to-capture", VF_IGNORE, 1, NULL, "kaon sizes its CUDA graphs itself"},
    {"--cuda-graph-sizes", VF_IGNORE, 2, NULL, "kaon sizes its CUDA graphs itself"},
    {"--max-cudagraph-capture-size", VF_IGNORE, 1, NULL, "kaon sizes its CUDA graphs itself"},
    {"-O", VF_IGNORE, 1, NULL, "kaon compiles nothing at start-up"},
    {"--compilation-config", VF_IGNORE, 1, NULL, "kaon compiles nothing at start-up"},
    {"--max-parallel-loading-workers", VF_IGNORE, 1, NULL, "kaon loads weights with its own threads"},
    {"--distributed-executor-backend", VF_IGNORE, 1, NULL, "kaon runs in one process"},
    {"--num-gpu-blocks-override", VF_IGNORE, 1, NULL, "size the KV cache with --gpu-memory-utilization or --kv-cache-memory"},
    {"--max-num-partial-prefills", VF_IGNORE, 1, NULL, "kaon's step budget is --max-num-batched-tokens"},
    {"--long-prefill-token-threshold", VF_IGNORE, 1, NULL, "kaon's step budget is --max-num-batched-tokens"},
    {"--prefix-caching-hash-algo", VF_IGNORE, 1, NULL, "kaon hashes blocks its own way"},
    {"--guided-decoding-backend", VF_IGNORE, 1, NULL, "kaon compiles structured outputs with its own grammars"},
    {"--structured-outputs-config", VF_IGNORE, 1, NULL, "kaon compiles structured outputs with its own grammars"},
    {"--chat-template-content-format", VF_IGNORE, 1, NULL, "kaon passes message content to the template as given"},
    {"--response-role", VF_IGNORE, 1, NULL, "kaon's responses are role assistant"},
    {"--allowed-origins", VF_IGNORE, 1, NULL, "kaon answers every origin (Access-Control-Allow-Origin: *)"},
    {"--allowed-methods", VF_IGNORE, 1, NULL, "kaon answers every origin (Access-Control-Allow-Origin: *)"},
    {"--allowed-headers", VF_IGNORE, 1, NULL, "kaon answers every origin (Access-Control-Allow-Origin: *)"},
    {"--allow-credentials", VF_IGNORE, 0, NULL, "kaon answers every origin (Access-Control-Allow-Origin: *)"},
    {"--enable-prompt-tokens-details", VF_IGNORE, 0, NULL, "kaon reports no cached-token details"},
    {"--enable-server-load-tracking", VF_IGNORE, 0, NULL, "kaon's load is in /metrics"},
    {"--enable-request-id-headers", VF_IGNORE, 0, NULL, "kaon does not echo X-Request-Id"},
    {"--async-scheduling", VF_IGNORE, 0, NULL, "kaon schedules its own way"},
    {"--calculate-kv-scales", VF_IGNORE, 0, NULL, "kaon's FP8 KV cache needs no calibration"},
    {"--disable-sliding-window", VF_IGNORE, 0, NULL, "kaon runs the model as its config.json says"},
    {"--otlp-traces-endpoint", VF_IGNORE, 1, NULL, "kaon exports no traces"},
    {"--collect-detailed-traces", VF_IGNORE, 1, NULL, "kaon exports no traces"},
    {"--show-hidden-metrics-for-version", VF_IGNORE, 1, NULL, "kaon's metrics are in /metrics"},
    {"--log-config-file", VF_IGNORE, 1, NULL, "kaon's log level is KAON_LOG"},
    // Refused.
    {"--quantization-param-path", VF_REFUSE, 1, NULL, "kaon reads KV scales from the checkpoint only"},
    {"--enable-lora", VF_REFUSE, 0, NULL, "kaon serves no LoRA adapters"},
    {"--lora-modules", VF_REFUSE, 2, NULL, "kaon serves no LoRA adapters"},
    {"--ssl-keyfile", VF_REFUSE, 1, NULL, "kaon serves plain HTTP: put a TLS proxy in front"},
    {"--ssl-certfile", VF_REFUSE, 1, NULL, "kaon serves plain HTTP: put a TLS proxy in front"},
    {"--uds", VF_REFUSE, 1, NULL, "kaon listens on TCP only"},
    {"--root-path", VF_REFUSE, 1, NULL, "kaon serves at /"},
    {"--middleware", VF_REFUSE, 1, NULL, "kaon runs no Python"},
    {"--tool-parser-plugin", VF_REFUSE, 1, NULL, "kaon runs no Python: see --tool-call-parser's names"},
    {"--reasoning-parser-plugin", VF_REFUSE, 1, NULL, "kaon runs no Python: see --reasoning-parser's names"},
    {"--hf-overrides", VF_REFUSE, 1, NULL, "kaon reads config.json as it is: edit a copy"},
    {"--override-generation-config", VF_REFUSE, 1, NULL, "kaon reads generation_config.json as it is: edit a copy"},
    {"--rope-scaling", VF_REFUSE, 1, NULL, "kaon reads config.json as it is: edit a copy"},
    {"--rope-theta", VF_REFUSE, 1, NULL, "kaon reads config.json as it is: edit a copy"},
    {"--hf-config-path", VF_REFUSE, 1, NULL, "kaon reads MODEL's own config.json"},
    {"--skip-tokenizer-init", VF_REFUSE, 0, NULL, "use --load-format dummy on a folder without tokenizer.json"},
    {"--speculative-model", VF_REFUSE, 1, NULL, "use --speculative-config"},
    {"--num-speculative-tokens", VF_REFUSE, 1, NULL, "use --speculative-config"},
    {"--kv-transfer-config", VF_REFUSE, 1, NULL, "kaon runs one engine"},
    {"--headless", VF_REFUSE, 0, NULL, "kaon runs one engine with its own HTTP front end"},
    {"--nnodes", VF_REFUSE, 1, NULL, "start a multi-node job with mpirun or srun (docs/API.md)"},
    {"--node-rank", VF_REFUSE, 1, NULL, "start a multi-node job with mpirun or srun (docs/API.md)"},
    {"--master-addr", VF_REFUSE, 1, NULL, "start a multi-node job with mpirun or srun (docs/API.md)"},
    {"--master-port", VF_REFUSE, 1, NULL, "start a multi-node job with mpirun or srun (docs/API.md)"},
    {"--enable-sleep-mode", VF_REFUSE, 0, NULL, "kaon has no sleep mode"},
};
#define N_TABLE (sizeof table / sizeof table[0])

static void say(FILE *f, const char *kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(FILE *f, const char *kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(f, "kaon: %s: ", kind);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    va_end(ap);
}

static int push(kaon_vllm_args *o, const char *s) {
    char **a = realloc(o->argv, sizeof *a * (size_t)(o->argc + 2));
    if (!a) return -1;
    o->argv = a;
    if (!(a[o->argc] = strdup(s))) return -1;
    a[++o->argc] = NULL;
    return 0;
}

static int set_str(char **dst, const char *s) {
    free(*dst);
    return (*dst = strdup(s)) ? 0 : -1;
}

static const vf_entry *lookup(const char *name, size_t len) {
    for (size_t i = 0; i < N_TABLE; i++)
        if (strlen(table[i].name) == len && !strncmp(table[i].name, name, len)) return &table[i];
    return NULL;
}

// Whether v is one of the comma-separated words of list.
static bool in_list(const char *list, const char *v) {
    size_t n = strlen(v);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, v, n)) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

bool kaon_vllm_parse_human_int(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s || isspace((unsigned char)*s)) return false;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v)) return false;
    double mul = 1;
    bool decimal_ok = false;
    if (*end) {
        const char *units = "kmgt", *bin = "KMGT";
        const char *u = strchr(units, *end), *b = strchr(bin, *end);
        if (*end && u) {
            mul = pow(1000.0, (double)(u - units + 1));
            decimal_ok = true;  // "25.6k": decimal units allow a fraction
        } else if (*end && b) {
            mul = pow(1024.0, (double)(b - bin + 1));
        } else {
            return false;
        }
        if (end[1]) return false;
    }
    if (!decimal_ok && v != floor(v)) return false;  // "1.5" and "1.5K" are not integers
    double r = floor(v * mul);  // vLLM truncates "1.0005k" to 1000
    if (r < (double)lo || r > (double)hi) return false;
    *out = (long long)r;
    return true;
}

void kaon_vllm_args_free(kaon_vllm_args *a) {
    if (!a) return;
    for (int i = 0; i < a->argc; i++) free(a->argv[i]);
    free(a->argv);
    free(a->quantization);
    free(a->tokenizer);
    free(a->dtype);
    memset(a, 0, sizeof *a);
}

int kaon_vllm_translate(int argc, char **argv, kaon_vllm_args *o, FILE *err) {
    memset(o, 0, sizeof *o);
    bool warned[N_TABLE] = {false};
    char name[256], num[32];
    const char *device = NULL;
    if (push(o, argc > 0 ? argv[0] : "serve")) goto oom;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || !a[1]) {  // the positional MODEL (and "-" / "" as given)
            if (push(o, a)) goto oom;
            continue;
        }
        // The flag's name (up to '='), with vLLM's underscores read as dashes.
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        if (len >= sizeof name) len = sizeof name - 1;
        memcpy(name, a, len);
        name[len] = 0;
        if (name[1] == '-')
            for (char *p = name + 2; *p; p++)
                if (*p == '_') *p = '-';
        if (name[1] == 'O' && name[2] && !eq) {  // "-O3": -O with its value attached
            name[2] = 0;
            len = 2;
            eq = a + 1;  // read as "-O=<value>": the value is eq + 1
        }
        const vf_entry *t = lookup(name, len);
        bool negated = false;
        if (!t && !strncmp(name, "--no-", 5)) {  // argparse's BooleanOptionalAction: --no-X
            char pos[256];
            snprintf(pos, sizeof pos, "--%s", name + 5);
            t = lookup(pos, strlen(pos));
            if (t && t->arity != 0) t = NULL;
            negated = t != NULL;
        }
        if (!t) {
            say(err, "error", "unknown option '%s' (see kaon serve --help)", a);
            return 2;
        }
        // The values: "=value", or the next argument(s).
        const char *vals[64] = {NULL};
        int nv = 0;
        if (t->arity == 0) {
            if (eq) {
                say(err, "error", "%s takes no value (got '%s')", name, a);
                return 2;
            }
        } else if (eq) {
            vals[nv++] = eq + 1;
        } else {
            if (i + 1 >= argc) {
                say(err, "error", "%s needs a value (see --help)", name);
                return 2;
            }
            vals[nv++] = argv[++i];
            // nargs="+": more values up to the next flag
            while (t->arity == 2 && nv < 64 && i + 1 < argc && argv[i + 1][0] != '-') vals[nv++] = argv[++i];
        }
        const size_t ti = (size_t)(t - table);
        if (negated) {  // "--no-X" asks for the default of a switch kaon has no use for
            if (t->kind == VF_REFUSE || t->kind == VF_IGNORE || t->kind == VF_ACCEPT ||
                !strcmp(t->name, "--enforce-eager"))
                continue;
            say(err, "error", "unknown option '%s' (see kaon serve --help)", a);
            return 2;
        }
        switch (t->kind) {
        case VF_KAON:
            if (push(o, t->to ? t->to : t->name) || (nv && push(o, vals[0]))) goto oom;
            if (!strcmp(t->name, "--device")) device = vals[0];
            break;
        case VF_ACCEPT:
            break;
        case VF_IGNORE:
            if (!warned[ti])
                say(err, "warning", "%s ignored: %s", t->name, t->why);
            warned[ti] = true;
            break;
        case VF_REFUSE:
            say(err, "error", "%s is not supported: %s", t->name, t->why);
            return 2;
        case VF_ONLY:
            if (!in_list(t->to, vals[0])) {
                say(err, "error", "%s %s is not supported: %s", t->name, vals[0], t->why);
                return 2;
            }
            break;
        case VF_SPECIAL:
            if (!strcmp(t->name, "--max-num-batched-tokens")) {  // vLLM's units here too
                long long n;
                if (!kaon_vllm_parse_human_int(vals[0], 1, 1 << 30, &n)) {
                    say(err, "error", "bad --max-num-batched-tokens '%s' (e.g. 8192, 8k, 8K)", vals[0]);
                    return 2;
                }
                snprintf(num, sizeof num, "%lld", n);
                if (push(o, "--max-num-batched-tokens") || push(o, num)) goto oom;
            } else if (!strcmp(t->name, "--max-model-len")) {
                long long n;
                if (!strcmp(vals[0], "-1") || !strcasecmp(vals[0], "auto")) break;  // kaon's default: what fits
                if (!kaon_vllm_parse_human_int(vals[0], 2, 1 << 30, &n)) {
                    say(err, "error", "bad --max-model-len '%s' (e.g. 4096, 32k = 32000, 32K = 32768, auto)", vals[0]);
                    return 2;
                }
                snprintf(num, sizeof num, "%lld", n);
                if (push(o, "--max-model-len") || push(o, num)) goto oom;
            } else if (!strcmp(t->name, "--kv-cache-memory-bytes")) {
                long long n;
                if (!kaon_vllm_parse_human_int(vals[0], 1, (long long)1 << 50, &n)) {
                    say(err, "error", "bad --kv-cache-memory-bytes '%s' (e.g. 2G, 512M, 4g = 4e9)", vals[0]);
                    return 2;
                }
                snprintf(num, sizeof num, "%lld", n);
                if (push(o, "--kv-cache-memory") || push(o, num)) goto oom;
            } else if (!strcmp(t->name, "--kv-cache-dtype")) {
                const char *v = !strcmp(vals[0], "bfloat16") ? "bf16" : vals[0];
                if (push(o, "--kv-cache-dtype") || push(o, v)) goto oom;
            } else if (!strcmp(t->name, "--served-model-name")) {
                for (int k = 0; k < nv; k++)  // kaon's flag takes one name: repeated, it adds one
                    if (push(o, "--served-model-name") || push(o, vals[k])) goto oom;
            } else if (!strcmp(t->name, "--dtype")) {
                if (!in_list("auto,bfloat16,bf16,float32,float", vals[0])) {
                    say(err, "error", "--dtype %s is not supported: kaon computes in bf16 on CUDA and f32 on "
                                      "the CPU (--dtype auto)", vals[0]);
                    return 2;
                }
                if (in_list("float32,float", vals[0]) && set_str(&o->dtype, vals[0])) goto oom;
            } else if (!strcmp(t->name, "--quantization") || !strcmp(t->name, "-q")) {
                if (set_str(&o->quantization, vals[0])) goto oom;
            } else if (!strcmp(t->name, "--tokenizer")) {
                if (set_str(&o->tokenizer, vals[0])) goto oom;
            } else if (!strcmp(t->name, "--enforce-eager")) {
                o->enforce_eager = true;
            }
            break;
        }
    }
    if (o->dtype && kaon_vllm_check_dtype(o->dtype, device, err)) return 2;
    return 0;
oom:
    say(err, "error", "out of memory");
    return 2;
}

int kaon_vllm_check_dtype(const char *dtype, const char *device, FILE *err) {
    if (!dtype || in_list("auto,bfloat16,bf16", dtype)) return 0;
    if (device && strcmp(device, "cpu")) {
        say(err, "error", "--dtype %s is not supported on %s: kaon computes in bf16 there (--dtype auto)", dtype,
            device);
        return 2;
    }
    return 0;  // the CPU computes in f32 anyway
}

static bool is_gguf(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char m[4] = {0};
    bool ok = fread(m, 1, 4, f) == 4 && !memcmp(m, "GGUF", 4);
    fclose(f);
    return ok;
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

// The folder of a model path: the path itself when a folder, else its parent.
static void model_dir(const char *model, char *dir, size_t cap) {
    snprintf(dir, cap, "%s", model);
    if (is_dir(dir)) return;
    char *slash = strrchr(dir, '/');
    if (slash == dir) slash[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, cap, ".");
}

// vLLM's kernel variants of one method, by the name quant_config.c reads from the checkpoint.
static const struct {
    const char *method;
    const char *names;
} quant_aliases[] = {
    {"awq", "awq,awq_marlin"},
    {"gptq", "gptq,gptq_marlin,gptq_marlin_24,gptq_bitblas"},
    {"fp8", "fp8,fbgemm_fp8,ptpc_fp8"},
    {"compressed-tensors", "compressed-tensors,compressed_tensors"},
    {"mxfp4", "mxfp4"},
    {"bitsandbytes", "bitsandbytes"},
    {"modelopt", "modelopt,modelopt_fp4"},
};

int kaon_vllm_check_quant(const char *want, const char *model, FILE *err) {
    if (!want) return 0;
    if (!model) return 0;
    if (!strncmp(model, "dummy:", 6)) model += 6;
    char detected[64] = "none";
    kaon_quant_method method = KAON_QUANT_NONE;
    if (is_gguf(model)) {
        snprintf(detected, sizeof detected, "gguf");
    } else {
        char dir[4096];
        model_dir(model, dir, sizeof dir);
        kaon_quant_config q;
        memset(&q, 0, sizeof q);
        if (kaon_quant_config_load(dir, &q) == 0) {
            method = q.method;
            if (q.method != KAON_QUANT_NONE) snprintf(detected, sizeof detected, "%s", q.method_name);
        }
        kaon_quant_config_free(&q);
    }
    if (!strcasecmp(want, detected) || (method == KAON_QUANT_NONE && !strcasecmp(want, "none"))) return 0;
    for (size_t i = 0; i < sizeof quant_aliases / sizeof quant_aliases[0]; i++) {
        if (strcasecmp(quant_aliases[i].method, detected)) continue;
        char w[64];
        snprintf(w, sizeof w, "%s", want);
        for (char *p = w; *p; p++) *p = (char)tolower((unsigned char)*p);
        if (in_list(quant_aliases[i].names, w)) return 0;
    }
    say(err, "error", "--quantization %s does not match the checkpoint, which is %s%s: kaon reads the method "
                      "from the model (leave --quantization out)",
        want, !strcmp(detected, "none") ? "not quantized " : "", !strcmp(detected, "none") ? "(none)" : detected);
    return 2;
}

int kaon_vllm_check_tokenizer(const char *tok, const char *model, FILE *err) {
    if (!tok || !model) return 0;
    if (!strncmp(model, "dummy:", 6)) model += 6;
    char a[PATH_MAX], b[PATH_MAX], dir[4096];
    model_dir(model, dir, sizeof dir);
    if (realpath(tok, a) && ((realpath(model, b) && !strcmp(a, b)) || (realpath(dir, b) && !strcmp(a, b))))
        return 0;
    say(err, "error", "--tokenizer %s is not supported: kaon uses the model's own tokenizer (%s)", tok, dir);
    return 2;
}
