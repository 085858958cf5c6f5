// kaon serve [MODEL] [options]: the OpenAI-compatible server (src/server/, docs/API.md).
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/load.h"
#include "cli/vllm_flags.h"
#include "dist/cluster.h"
#include "server/reasoning_parser.h"
#include "server/replicas.h"
#include "server/server.h"
#include "server/tool_parser.h"
#include "util/err.h"
#include "util/log.h"

// Atomic, not volatile sig_atomic_t: the signal may run on any of the server's threads while
// the main thread polls the flag (lock-free atomics are async-signal-safe).
static atomic_int stop_flag;

static void on_signal(int sig) {
    (void)sig;
    if (atomic_exchange(&stop_flag, 1)) _exit(130);  // a second Ctrl-C: leave now
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: kaon serve [MODEL] [options]\n"
            "Serves MODEL (a GGUF file or a Hugging Face folder; default: the bundled\n"
            "SmolLM2-135M-Instruct) over an OpenAI-compatible HTTP API, with a chat page at /.\n"
            "options:\n"
            "  -m, --model PATH               the model (same as the positional MODEL)\n"
            "  --host ADDR                    bind address (default 127.0.0.1)\n"
            "  --port N                       port (default 8000; 0 picks a free one)\n"
            "  --api-key KEY                  require 'Authorization: Bearer KEY' (also $KAON_API_KEY)\n"
            "  --served-model-name NAME       the model's name in the API (default: file name);\n"
            "                                 repeated: every name is answered, the first listed first\n"
            "  --max-num-seqs N               sequences running at once (default 256)\n"
            "  --max-model-len N              context limit (default: the model's, capped by the KV pool)\n"
            "  --max-num-batched-tokens N     token budget of one engine step (default 512 on the CPU)\n"
            "  --gpu-memory-utilization F     fraction of GPU memory (default 0.9)\n"
            "  --kv-cache-memory SIZE         KV-cache bytes on the CPU, e.g. 512M, 2G (default 1G)\n"
            "  --kv-cache-dtype T             " KAON_CLI_KV_DTYPE_HELP "\n"
            "  --device DEV                   where the model runs: cpu (default), cuda, cuda:N\n"
            "  --load-format auto|dummy       dummy: random weights from MODEL = a config.json or its folder\n"
            "                                 (a tokenizer.json in that folder is used; else token-id prompts only)\n"
            "  --threads N                    CPU threads (default: physical cores)\n"
            "  -tp, --tensor-parallel-size N  ranks of tensor parallelism (CPU: a worker thread each; CUDA: a GPU each)\n"
            "  --enable-expert-parallel       MoE models under -tp: experts placed whole on ranks, not split\n"
            "  -dp, --data-parallel-size N    N engine replicas in this process (1..64), each request routed\n"
            "                                 to the one caching most of its prompt, else the least loaded;\n"
            "                                 CPU: --threads split among them; cuda: replica i on cuda:i;\n"
            "                                 the KV cache size is per replica. With --enable-expert-parallel\n"
            "                                 (MoE models): DP attention over N ranks of one engine instead\n"
            "  --block-size N                 KV block size in tokens\n"
            "  --no-prefix-caching            turn prefix caching off\n"
            "  --expert-stats                 MoE models: tokens routed to each expert in /metrics\n"
            "  --speculative-config JSON      " KAON_CLI_SPEC_HELP "\n"
            "  --chat-template FILE           a Jinja chat template overriding the model's\n"
            "  --tool-call-parser NAME        how tool calls are read from the output, for requests with\n"
            "                                 tools: auto (default: from the chat template's markers),\n"
            "                                 none, hermes, llama3_json, mistral, deepseek_v3, kimi_k2\n"
            "  --reasoning-parser NAME        <think> blocks -> reasoning_content: auto (default: from the\n"
            "                                 chat template), none, deepseek_r1, qwen3\n"
            "limits (beyond them: an OpenAI error JSON; see docs/SECURITY.md):\n"
            "  --max-body-size SIZE           largest request body (default 8M; larger: 413)\n"
            "  --max-connections N            concurrent connections (default 16384; more: 503)\n"
            "  --max-queue N                  sequences waiting for a slot (default 16384; more: 429)\n"
            "  --max-prompt-tokens N          longest prompt in tokens (default: the context)\n"
            "  --max-tokens N                 largest max_tokens, and the cap when absent (default: the context)\n"
            "  --max-n N                      largest n (default 128)\n"
            "  --request-timeout SECONDS      abort a generation running longer: 504 (default 0: none)\n"
            "  --drain-timeout SECONDS        on SIGTERM/SIGINT, time for running requests (default 30)\n"
            "  --port-file FILE               write \"HOST PORT\" here once listening\n"
            "  --plugin PATH                  load a plugin adding architectures (repeatable; $KAON_PLUGINS too)\n"
            "vLLM's spellings are accepted too (--max_model_len 32k, --flag=value, -tp 1, --enforce-eager,\n"
            "--trust-remote-code, ...; $VLLM_API_KEY): what each does is in docs/API.md, \"vLLM compatibility\".\n");
}

// "123", "512K", "64M", "2G" (binary units), "1.5G".
static int parse_size(const char *s, size_t *out) {
    if (!s || !*s) return -1;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0)) return -1;
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; break;
        case 'm': case 'M': mul = 1024.0 * 1024; break;
        case 'g': case 'G': mul = 1024.0 * 1024 * 1024; break;
        case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
        default: return -1;
        }
        end++;
        if (*end == 'i' || *end == 'I') end++;
        if (*end == 'b' || *end == 'B') end++;
        if (*end) return -1;
    }
    double bytes = v * mul;
    if (bytes > 9.0e18) return -1;
    *out = (size_t)bytes;
    return 0;
}

static char *read_text_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            if (cap > ((size_t)16 << 20)) {  // 16 MiB is far beyond any chat template
                free(buf);
                buf = NULL;
                break;
            }
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        if (!got) break;
        n += got;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

// Many concurrent clients need many file descriptors: raise the soft limit to the hard one.
static int raise_fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur > 1000000 ? 1000000 : (int)rl.rlim_cur;
}

int kaon_cmd_serve(int argc, char **argv) {
    kaon_server_options o;
    kaon_server_options_default(&o);
    kaon_engine_options_default(&o.engine);
    o.api_key = getenv("KAON_API_KEY");
    if (!o.api_key) o.api_key = getenv("VLLM_API_KEY");
    const char *vll = getenv("VLLM_LOGGING_LEVEL");
    if (vll && !getenv("KAON_LOG")) {  // vLLM's levels, read before anything is logged
        const char *lv = !strcasecmp(vll, "debug") ? "debug" : !strcasecmp(vll, "warning") ? "warn"
                       : (!strcasecmp(vll, "error") || !strcasecmp(vll, "critical")) ? "error" : "info";
        setenv("KAON_LOG", lv, 1);
    }
    // vLLM's flags -> kaon's (vllm_flags.c); the strings live as long as the process.
    static kaon_vllm_args va;
    int vrc = kaon_vllm_translate(argc, argv, &va, stderr);
    if (vrc) return vrc;
    argc = va.argc;
    argv = va.argv;
    const char *model = NULL, *template_file = NULL;
    bool conns_set = false, dummy = false;
    long v;
    double d;
    // argv[0] is "serve".
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED()                                                                   \
    do {                                                                         \
        if (!next) return kaon_cli_fail("%s needs a value (see --help)", a);     \
        i++;                                                                     \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            NEED();
            model = next;
        } else if (!strcmp(a, "--host")) {
            NEED();
            o.host = next;
        } else if (!strcmp(a, "--port")) {
            NEED();
            if (!kaon_cli_parse_int(next, 0, 65535, &v)) return kaon_cli_fail("bad --port '%s'", next);
            o.port = (int)v;
        } else if (!strcmp(a, "--api-key")) {
            NEED();
            o.api_key = next;
        } else if (!strcmp(a, "--served-model-name")) {
            NEED();
            if (o.n_served_model_names == KAON_SERVE_MAX_NAMES)
                return kaon_cli_fail("at most %d --served-model-name values", KAON_SERVE_MAX_NAMES);
            o.served_model_names[o.n_served_model_names++] = next;
        } else if (!strcmp(a, "--max-num-seqs")) {
            NEED();
            if (!kaon_cli_parse_int(next, 1, 1 << 20, &v)) return kaon_cli_fail("bad --max-num-seqs '%s'", next);
            o.engine.max_num_seqs = (int)v;
        } else if (!strcmp(a, "--max-model-len")) {
            NEED();
            if (!kaon_cli_parse_int(next, 2, 1 << 30, &v)) return kaon_cli_fail("bad --max-model-len '%s'", next);
            o.engine.max_model_len = (int)v;
        } else if (!strcmp(a, "--max-num-batched-tokens")) {
            NEED();
            if (!kaon_cli_parse_int(next, 1, 1 << 30, &v))
                return kaon_cli_fail("bad --max-num-batched-tokens '%s'", next);
            o.engine.max_num_batched_tokens = (int)v;
        } else if (!strcmp(a, "--gpu-memory-utilization")) {
            NEED();
            if (!kaon_cli_parse_float(next, 0.01, 1.0, &d))
                return kaon_cli_fail("bad --gpu-memory-utilization '%s' (0.01..1)", next);
            o.engine.gpu_memory_utilization = d;
        } else if (!strcmp(a, "--kv-cache-memory")) {
            NEED();
            if (parse_size(next, &o.engine.kv_cache_memory) || !o.engine.kv_cache_memory)
                return kaon_cli_fail("bad --kv-cache-memory '%s' (e.g. 512M, 2G)", next);
        } else if (!strcmp(a, "--kv-cache-dtype")) {
            NEED();
            if (kaon_cli_check_kv_dtype(next)) return 2;
            o.engine.kv_cache_dtype = next;
        } else if (!strcmp(a, "--device")) {
            NEED();
            if (kaon_cli_check_device(next, false)) return 2;
            o.engine.device = next;
        } else if (!strcmp(a, "--load-format")) {
            NEED();
            if (strcmp(next, "auto") && strcmp(next, "dummy"))
                return kaon_cli_fail("bad --load-format '%s' (auto or dummy)", next);
            dummy = !strcmp(next, "dummy");
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            NEED();
            if (!kaon_cli_parse_int(next, 1, 4096, &v)) return kaon_cli_fail("bad --threads '%s'", next);
            o.engine.n_threads = (int)v;
        } else if (!strcmp(a, "--tensor-parallel-size") || !strcmp(a, "-tp")) {
            NEED();
            if (!kaon_cli_parse_int(next, 1, 64, &v)) return kaon_cli_fail("bad --tensor-parallel-size '%s'", next);
            o.engine.tensor_parallel_size = (int)v;
        } else if (!strcmp(a, "--data-parallel-size") || !strcmp(a, "-dp")) {
            NEED();
            if (!kaon_cli_parse_int(next, 1, KAON_SERVE_MAX_REPLICAS, &v))
                return kaon_cli_fail("bad --data-parallel-size '%s' (an integer, 1..%d)", next,
                                     KAON_SERVE_MAX_REPLICAS);
            o.data_parallel_size = (int)v;
        } else if (!strcmp(a, "--block-size")) {
            NEED();
            if (!kaon_cli_parse_int(next, 1, 4096, &v)) return kaon_cli_fail("bad --block-size '%s'", next);
            o.engine.block_size = (int)v;
        } else if (!strcmp(a, "--no-prefix-caching") || !strcmp(a, "--no-enable-prefix-caching")) {
            o.engine.disable_prefix_caching = true;
        } else if (!strcmp(a, "--enable-prefix-caching")) {
            o.engine.disable_prefix_caching = false;
        } else if (!strcmp(a, "--speculative-config")) {
            NEED();
            if (kaon_cli_parse_spec_config(next, &o.engine.speculative)) return 2;
        } else if (!strcmp(a, "--expert-stats")) {
            o.engine.expert_stats = true;
        } else if (!strcmp(a, "--enable-expert-parallel")) {
            o.engine.enable_expert_parallel = true;
        } else if (!strcmp(a, "--chat-template")) {
            NEED();
            template_file = next;
        } else if (!strcmp(a, "--tool-call-parser")) {
            NEED();
            kaon_tool_family tf;
            if (strcmp(next, "auto") && kaon_tool_family_from_name(next, &tf) < 0)
                return kaon_cli_fail("bad --tool-call-parser '%s' (auto, none, %s)", next,
                                     kaon_tool_family_names);
            o.tool_call_parser = next;
        } else if (!strcmp(a, "--reasoning-parser")) {
            NEED();
            kaon_reasoning_family rf;
            if (strcmp(next, "auto") && kaon_reasoning_family_from_name(next, &rf) < 0)
                return kaon_cli_fail("bad --reasoning-parser '%s' (auto, none, %s)", next,
                                     kaon_reasoning_family_names);
            o.reasoning_parser = next;
        } else if (!strcmp(a, "--max-body-size")) {
            NEED();
            if (parse_size(next, &o.max_body_bytes) || o.max_body_bytes < 1024)
                return kaon_cli_fail("bad --max-body-size '%s' (at least 1K)", next);
        } else if (!strcmp(a, "--max-connections")) {
            NEED();
            if (!kaon_cli_parse_int(next, 1, 1000000, &v)) return kaon_cli_fail("bad --max-connections '%s'", next);
            o.max_connections = (int)v;
            conns_set = true;
        } else if (!strcmp(a, "--max-queue")) {
            NEED();
            if (!kaon_cli_parse_int(next, 1, 1 << 24, &v)) return kaon_cli_fail("bad --max-queue '%s'", next);
            o.max_queue = (int)v;
        } else if (!strcmp(a, "--max-prompt-tokens")) {
            NEED();
            if (!kaon_cli_parse_int(next, 1, 1 << 30, &v))
                return kaon_cli_fail("bad --max-prompt-tokens '%s'", next);
            o.max_prompt_tokens = (int)v;
        } else if (!strcmp(a, "--max-tokens")) {
            NEED();
            if (!kaon_cli_parse_int(next, 1, 1 << 30, &v)) return kaon_cli_fail("bad --max-tokens '%s'", next);
            o.max_tokens = (int)v;
        } else if (!strcmp(a, "--max-n")) {
            NEED();
            if (!kaon_cli_parse_int(next, 1, 128, &v)) return kaon_cli_fail("bad --max-n '%s' (1..128)", next);
            o.max_n = (int)v;
        } else if (!strcmp(a, "--request-timeout")) {
            NEED();
            if (!kaon_cli_parse_float(next, 0, 86400 * 7, &d))
                return kaon_cli_fail("bad --request-timeout '%s'", next);
            o.request_timeout_s = d;
        } else if (!strcmp(a, "--drain-timeout")) {
            NEED();
            if (!kaon_cli_parse_float(next, 0, 86400, &d)) return kaon_cli_fail("bad --drain-timeout '%s'", next);
            o.drain_timeout_s = d;
        } else if (!strcmp(a, "--port-file")) {
            NEED();
            o.ready_file = next;
        } else if (a[0] == '-' && a[1]) {
            return kaon_cli_fail("unknown option '%s' (see kaon serve --help)", a);
        } else if (!model) {
            model = a;
        } else {
            return kaon_cli_fail("more than one model given ('%s' and '%s')", model, a);
        }
#undef NEED
    }
    // With expert parallelism the ranks are DP attention inside one engine (vLLM's meaning for
    // MoE models), not replicas.
    if (o.data_parallel_size > 1 && o.engine.enable_expert_parallel) {
        o.engine.data_parallel_size = o.data_parallel_size;
        o.data_parallel_size = 1;
    }
    if (dummy && !model) return kaon_cli_fail("--load-format dummy needs MODEL: a config.json or its folder");
    char dummy_spec[4200];
    if (dummy) {  // the model loader reads "dummy:<config>" as random weights of the config's shapes
        if (snprintf(dummy_spec, sizeof dummy_spec, "dummy:%s", model) >= (int)sizeof dummy_spec)
            return kaon_cli_fail("model path too long");
        char tok[4200];
        struct stat sb;
        bool has_tok = stat(model, &sb) == 0 && S_ISDIR(sb.st_mode) &&
                       snprintf(tok, sizeof tok, "%s/tokenizer.json", model) < (int)sizeof tok && access(tok, R_OK) == 0;
        if (!has_tok)
            fprintf(stderr, "kaon: serve: no tokenizer.json beside the dummy config: prompts must be token ids "
                            "(/v1/completions), and streams carry no text\n");
        model = dummy_spec;
        o.engine.load_tokenizer = has_tok;
    }
    if (!model) model = kaon_cli_default_model();
    if (!model)
        return kaon_cli_fail("no model given and the default model (models/%s) was not found; run "
                             "scripts/setup.sh or pass a MODEL",
                             KAON_DEFAULT_MODEL_FILE);
    o.engine.model = model;
    if (!dummy) o.engine.load_tokenizer = true;
    if (kaon_vllm_check_quant(va.quantization, model, stderr) ||
        kaon_vllm_check_tokenizer(va.tokenizer, model, stderr))
        return 2;
    if (va.enforce_eager) setenv("KAON_CUDA_GRAPHS", "0", 1);  // the CUDA backend reads it when created

    char *tmpl = NULL;
    if (template_file) {
        tmpl = read_text_file(template_file);
        if (!tmpl) return kaon_cli_fail("cannot read --chat-template '%s'", template_file);
        o.chat_template = tmpl;
    }
    int fds = raise_fd_limit();
    // Leave room for the model, logs and the 64 connections answered 503 beyond the limit.
    if (o.max_connections > fds - 192) {
        int cap = fds > 256 ? fds - 192 : 64;
        KAON_WARN("serve: the file-descriptor limit is %d (ulimit -n; the hard limit allows no "
                  "more), too low for %d connections: %s %d. Raise the hard limit (ulimit -Hn, "
                  "/etc/security/limits.conf, systemd LimitNOFILE) for more.", fds,
                  o.max_connections, conns_set ? "--max-connections lowered to" : "serving at most",
                  cap);
        o.max_connections = cap;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);  // a client gone mid-write must not kill the server

    // A multi-node job: process 0 serves; the others hold their ranks and run its steps.
    if (kaon_cluster_get() && o.data_parallel_size > 1 && !o.engine.enable_expert_parallel) {
        free(tmpl);
        return kaon_cli_fail("--data-parallel-size replicas in a multi-node job are not supported yet");
    }
    if (kaon_cluster_follower()) {
        kaon_engine *e = kaon_engine_create(&o.engine);
        if (!e) {
            free(tmpl);
            return kaon_cli_fail("%s", kaon_last_error());
        }
        kaon_cli_follow_if_follower(e);
    }
    int rc = kaon_server_run(&o, &stop_flag);
    free(tmpl);
    if (rc < 0) {
        fprintf(stderr, "kaon: error: %s\n", kaon_last_error());
        return 1;
    }
    return 0;
}
