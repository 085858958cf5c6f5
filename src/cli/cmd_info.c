// kaon info: what a model is and what it needs. With --expert-load (MoE models), also runs a
// prompt and prints how many tokens each layer routed to each expert.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "model/tp.h"
#include "cli/load.h"
#include "model/arch.h"
#include "model/moe.h"
#include "server/replicas.h"
#include "util/err.h"

static void usage(void) {
    printf("usage: kaon info [MODEL] [options]   (GGUF file or Hugging Face folder; default model if absent)\n"
           "  -m, --model PATH       the model (or give it as the first argument)\n"
           "  --load-format dummy    describe a config.json (random weights; with --device cuda)\n"
           "  --expert-load          MoE models: run a prompt and print the tokens each layer\n"
           "                         routed to each expert (prefill, then -n greedy tokens)\n"
           "  -p, --prompt TEXT      the prompt (default: a few sentences)\n"
           "  --prompt-ids IDS       the prompt as token ids\n"
           "  -n N                   greedy tokens generated after the prompt (default 0)\n"
           "  --device DEV           where the prompt runs: cpu (default), cuda, cuda:N\n"
           "  --threads N            CPU threads\n"
           "  -dp, --data-parallel-size N   the memory plan of kaon serve -dp N: per replica\n"
           "  -tp, --tensor-parallel-size N the layout and memory plan of -tp N: per rank\n"
           "  --enable-expert-parallel      with -tp: MoE experts whole on ranks\n"
           "  --json                 the expert load as one JSON object on stdout\n");
}

// A GGUF file's tensor types with their counts and bytes, read from the metadata alone: every
// tensor of the file, of types kaon computes with or not. Largest first.
static void print_file_types(const kaon_gguf *g) {
    enum { MAX_TYPES = 64 };
    struct file_type {
        uint32_t type;
        uint64_t n, bytes;
        bool unsized;
    } ty[MAX_TYPES];
    int nt = 0;
    for (int64_t i = 0; i < kaon_gguf_tensor_count(g); i++) {
        const kaon_gguf_tensor *t = kaon_gguf_tensor_at(g, i);
        int k = 0;
        while (k < nt && ty[k].type != t->ggml_type) k++;
        if (k == nt) {
            if (nt == MAX_TYPES) continue;
            ty[nt].type = t->ggml_type;
            ty[nt].n = ty[nt].bytes = 0;
            ty[nt].unsized = false;
            nt++;
        }
        ty[k].n++;
        ty[k].bytes += t->nbytes;
        ty[k].unsized |= t->unsized;
    }
    for (int a = 1; a < nt; a++)  // by bytes, descending (insertion sort: a handful of types)
        for (int b = a; b > 0 && ty[b].bytes > ty[b - 1].bytes; b--) {
            const struct file_type tmp = ty[b];
            ty[b] = ty[b - 1];
            ty[b - 1] = tmp;
        }
    printf("tensor types:  ");
    for (int k = 0; k < nt; k++) {
        printf("%s %s x%llu", k ? "," : "", kaon_gguf_type_name(ty[k].type), (unsigned long long)ty[k].n);
        const bool ok = kaon_dtype_from_ggml(ty[k].type) != KAON_DTYPE_INVALID;
        if (ty[k].unsized) printf(" (ggml type %u, layout unknown; not supported)", ty[k].type);
        else printf(" (%.1f MiB%s)", ty[k].bytes / 1048576.0, ok ? "" : ", not supported");
    }
    printf("  [%lld tensors in the file]\n", (long long)kaon_gguf_tensor_count(g));
}

static const char *default_prompt =
    "The history of the city begins with a small settlement by the river. Over the centuries "
    "it grew into a centre of trade, science and music; today its universities, markets and "
    "old harbour draw visitors from all over the world.";

typedef struct info_opts {
    const char *path, *prompt, *prompt_ids, *device;
    bool expert_load, json, dummy, ep;
    long n_gen, threads, dp, tp;
} info_opts;

// Runs the prompt (and n_gen greedy tokens) through an engine counting expert load; prints it.
static int expert_load(const kaon_model *m, const info_opts *o) {
    const kaon_model_config *c = &m->cfg;
    if (c->n_experts <= 0) return kaon_cli_fail("--expert-load: %s has no experts", m->path);
    int32_t *ids = NULL;
    int n = 0, rc = 2;
    if (o->prompt_ids) {
        if (kaon_cli_parse_ids(o->prompt_ids, &ids, &n) || n == 0) return kaon_cli_fail("bad --prompt-ids");
        for (int i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= c->vocab_size) {
                free(ids);
                return kaon_cli_fail("prompt id %d is outside the vocabulary (%d)", ids[i], c->vocab_size);
            }
    } else {
        kaon_tokenizer *tok = kaon_cli_load_tokenizer(m);
        if (!tok) return 2;
        const char *text = o->prompt ? o->prompt : default_prompt;
        size_t nn = 0;
        int trc = kaon_tokenize(tok, text, strlen(text), true, &ids, &nn);
        kaon_tokenizer_free(tok);
        if (trc || nn == 0) return kaon_cli_fail("tokenize: %s", trc ? kaon_last_error() : "empty prompt");
        n = (int)nn;
    }
    const int L = c->n_layers, E = c->n_experts;
    uint64_t *load = calloc((size_t)L * E, sizeof *load);
    kaon_request *r = NULL;
    kaon_engine_options eo;
    kaon_engine_options_default(&eo);
    eo.device = o->device;
    eo.n_threads = (int)o->threads;
    eo.load_tokenizer = false;
    eo.max_num_seqs = 1;
    eo.max_model_len = n + (int)o->n_gen + 1;
    eo.expert_stats = true;
    kaon_cli_quiet_logs();
    kaon_engine *eng = load ? kaon_cli_engine(&eo, o->path, o->dummy) : NULL;
    if (!load) kaon_cli_fail("out of memory");
    if (!eng) goto out;
    // n_gen greedy tokens (the last one is sampled, not fed); with none, the prompt alone:
    // its one sampled token is never fed either.
    kaon_sampling sp;
    kaon_sampling_default(&sp);
    sp.temperature = 0;
    sp.ignore_eos = true;
    sp.max_tokens = o->n_gen > 0 ? (int)o->n_gen : 1;
    if (!(r = kaon_engine_submit(eng, ids, n, &sp))) {
        kaon_cli_fail("%s", kaon_last_error());
        goto out;
    }
    kaon_output out;
    while (kaon_request_next(r, &out, -1) == 1) {
        if (out.finish == KAON_FINISH_ERROR) {
            kaon_cli_fail("%s", out.error ? out.error : "the forward pass failed");
            goto out;
        }
        if (out.finished) break;
    }
    if (kaon_engine_expert_load(eng, load, (size_t)L * E, NULL, NULL)) {
        kaon_cli_fail("%s", kaon_last_error());
        goto out;
    }
    // Tokens fed: the prompt and all generated tokens but the last.
    const int fed = n + (o->n_gen > 0 ? (int)o->n_gen - 1 : 0);
    if (o->json) {
        printf("{\"tokens\": %d, \"top_k\": %d, \"n_experts\": %d, \"layers\": [", fed, c->n_experts_used, E);
        bool first = true;
        for (int l = 0; l < L; l++) {
            if (!kaon_model_layer_is_moe(m, l)) continue;
            printf("%s{\"layer\": %d, \"counts\": [", first ? "" : ", ", l);
            for (int e = 0; e < E; e++) printf(e ? ", %llu" : "%llu", (unsigned long long)load[(size_t)l * E + e]);
            printf("]}");
            first = false;
        }
        printf("]}\n");
        rc = 0;
        goto out;
    }
    printf("expert load:    %d tokens x top-%d of %d experts on %s (tokens routed to each expert;\n"
           "                imbalance = busiest expert / mean, idle = experts that got none)\n",
           fed, c->n_experts_used, E, eo.device ? eo.device : "cpu");
    for (int l = 0; l < L; l++) {
        if (!kaon_model_layer_is_moe(m, l)) continue;
        const uint64_t *row = load + (size_t)l * E;
        uint64_t mx = 0, sum = 0;
        int idle = 0;
        for (int e = 0; e < E; e++) {
            sum += row[e];
            if (row[e] > mx) mx = row[e];
            idle += row[e] == 0;
        }
        const double mean = (double)sum / E;
        printf("  layer %3d: imbalance %5.2f, idle %3d |", l, mean > 0 ? mx / mean : 0.0, idle);
        for (int e = 0; e < E; e++) printf(" %llu", (unsigned long long)row[e]);
        printf("\n");
    }
    rc = 0;
out:
    kaon_request_free(r);
    kaon_engine_destroy(eng);
    free(load);
    free(ids);
    return rc;
}

// kaon serve -dp N's plan: N whole engines, each its device, threads, weights and KV cache.
static void print_replicas(const kaon_model *m, const info_opts *o) {
    const int n = (int)o->dp;
    const bool cpu = !o->device || !strcmp(o->device, "cpu");
    printf("data parallel:  %d replicas (kaon serve -dp %d), each a whole engine with its own KV cache "
           "(--kv-cache-memory / --gpu-memory-utilization apply to each); weights %s\n", n, n,
           cpu ? "mapped once, their pages shared" : "a copy on each replica's device");
    for (int i = 0; i < n; i++) {
        char dev[32];
        if (kaon_replica_device(o->device, 1, i, n, dev, sizeof dev) < 0) return;
        if (cpu)
            printf("  replica %d:    device %s, %d threads\n", i, dev, kaon_replica_threads((int)o->threads, n));
        else
            printf("  replica %d:    device %s, weights %.1f MiB\n", i, dev, m->weight_bytes / 1048576.0);
    }
}

// The layout of -tp N (--enable-expert-parallel): each rank's heads, FFN and experts, and what
// it holds: its weights (kaon_tp_plan_bytes: the shard as it will be cut) and KV bytes per token.
static int print_tensor_parallel(const kaon_model *m, const info_opts *o) {
    const kaon_model_config *c = &m->cfg;
    const int n = (int)o->tp;
    kaon_tp_layout lay;
    for (int r = 0; r < n; r++)
        if (kaon_tp_plan(m, n, r, o->ep, &lay)) return kaon_cli_fail("%s", kaon_last_error());
    const size_t kv16 = kaon_model_kv_bytes_per_token(m, 2);
    printf("tensor parallel: %d ranks (kaon serve -tp %d%s); weights as each rank holds them (split tensors "
           "its slice, the rest whole), KV per token in bf16\n", n, n, o->ep ? " --enable-expert-parallel" : "");
    for (int r = 0; r < n; r++) {
        kaon_tp_plan(m, n, r, o->ep, &lay);
        const uint64_t w = kaon_tp_plan_bytes(m, &lay);
        // MLA's latent is read by every head: each rank keeps all of it.
        const size_t kv = c->kv_lora_rank > 0 ? kv16 : kv16 / (size_t)c->n_kv_heads * (size_t)lay.nkv;
        printf("  rank %d:  Q heads [%d, %d), KV heads [%d, %d)%s, FFN [%d, %d)", r, lay.q0, lay.q0 + lay.nq, lay.kv0,
               lay.kv0 + lay.nkv, c->n_kv_heads < n ? " (replicated)" : "", lay.f0, lay.f0 + lay.nf);
        if (c->n_experts > 0)
            printf(", experts [%d, %d) FFN [%d, %d)", lay.e0, lay.e0 + lay.ne, lay.mf0, lay.mf0 + lay.nmf);
        printf(": weights %.1f MiB (%llu B), KV %zu B/token\n", w / 1048576.0, (unsigned long long)w, kv);
    }
    return 0;
}

int kaon_cmd_info(int argc, char **argv) {
    info_opts o;
    memset(&o, 0, sizeof o);
    o.threads = kaon_cli_default_threads();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
#define NEED_VALUE() if (!v) return kaon_cli_fail("option %s needs a value", a); i++
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { NEED_VALUE(); o.path = v; }
        else if (!strcmp(a, "--expert-load")) o.expert_load = true;
        else if (!strcmp(a, "--json")) o.json = true;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { NEED_VALUE(); o.prompt = v; }
        else if (!strcmp(a, "--prompt-ids")) { NEED_VALUE(); o.prompt_ids = v; }
        else if (!strcmp(a, "-n")) {
            NEED_VALUE();
            if (!kaon_cli_parse_int(v, 0, 1 << 20, &o.n_gen)) return kaon_cli_fail("bad -n '%s'", v);
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            NEED_VALUE();
            if (!kaon_cli_parse_int(v, 1, 1024, &o.threads)) return kaon_cli_fail("bad --threads '%s'", v);
        } else if (!strcmp(a, "--data-parallel-size") || !strcmp(a, "-dp")) {
            NEED_VALUE();
            if (!kaon_cli_parse_int(v, 1, KAON_SERVE_MAX_REPLICAS, &o.dp))
                return kaon_cli_fail("bad --data-parallel-size '%s' (an integer, 1..%d)", v, KAON_SERVE_MAX_REPLICAS);
        } else if (!strcmp(a, "--tensor-parallel-size") || !strcmp(a, "-tp")) {
            NEED_VALUE();
            if (!kaon_cli_parse_int(v, 1, 1024, &o.tp)) return kaon_cli_fail("bad --tensor-parallel-size '%s'", v);
        } else if (!strcmp(a, "--enable-expert-parallel")) {
            o.ep = true;
        } else if (!strcmp(a, "--device")) {
            NEED_VALUE();
            if (kaon_cli_check_device(v, false)) return 2;
            o.device = v;
        } else if (!strcmp(a, "--load-format")) {
            NEED_VALUE();
            if (strcmp(v, "auto") && strcmp(v, "dummy")) return kaon_cli_fail("bad --load-format '%s' (auto, dummy)", v);
            o.dummy = !strcmp(v, "dummy");
        } else if (a[0] == '-') {
            return kaon_cli_fail("unknown option '%s'", a);
        } else {
            o.path = a;
        }
#undef NEED_VALUE
    }
    if (o.prompt && o.prompt_ids) return kaon_cli_fail("give one of -p TEXT or --prompt-ids IDS");
    kaon_model *m = NULL;
    kaon_gguf *meta = NULL;  // a GGUF file's metadata: its tensor types, even when it does not load
    if (o.dummy) {
        if (!o.path) return kaon_cli_fail("--load-format dummy needs -m CONFIG (a config.json or its folder)");
        m = kaon_model_load_dummy(o.path);
        if (!m) return kaon_cli_fail("%s", kaon_last_error());
    } else {
        const char *path = o.path ? o.path : kaon_cli_default_model();
        if (kaon_cli_is_gguf(path)) meta = kaon_gguf_open_metadata(path);
        m = kaon_cli_load_model(o.path);
    }
    if (!m) {
        if (meta) {
            printf("model:          %s (does not load)\n", o.path ? o.path : kaon_cli_default_model());
            print_file_types(meta);
        }
        kaon_gguf_close(meta);
        return 2;
    }
    const kaon_model_config *c = &m->cfg;
    if (o.expert_load && o.json) {
        int rc = expert_load(m, &o);
        kaon_model_free(m);
        kaon_gguf_close(meta);
        return rc;
    }
    kaon_weight_count wc;
    kaon_spec_count *rows = calloc((size_t)m->arch->n_weights, sizeof *rows);
    if (!rows) {
        kaon_model_free(m);
        kaon_gguf_close(meta);
        return kaon_cli_fail("out of memory");
    }
    kaon_weights_count(m, &wc, rows);
    int n_moe = 0;
    for (int l = 0; l < c->n_layers; l++) n_moe += kaon_model_layer_is_moe(m, l);
    // Parameters of the routed experts a token does not use.
    const uint64_t inactive = c->n_experts > 0 ? wc.expert_params / (uint64_t)c->n_experts *
                                                     (uint64_t)(c->n_experts - c->n_experts_used)
                                               : 0;
    const char *fmt = m->format == KAON_FORMAT_GGUF ? "GGUF"
                      : m->format == KAON_FORMAT_DUMMY ? "dummy (random weights from config.json)"
                                                       : "safetensors (Hugging Face folder)";
    printf("model:          %s\n", m->path);
    printf("format:         %s\n", fmt);
    if (c->arch == KAON_ARCH_PLUGIN) printf("architecture:   %s (%s, a plugin)\n", c->arch_name, c->impl->label);
    else
        printf("architecture:   %s (%s%s)\n", c->arch_name, kaon_arch_label(c->arch),
               c->n_experts > 0 ? " attention, mixture of experts" : "");
    printf("parameters:     %.1f M (%llu)\n", m->n_params / 1e6, (unsigned long long)m->n_params);
    if (n_moe)
        printf("active/token:   %.1f M (the routed experts' share: top %d of %d)\n",
               (m->n_params - inactive) / 1e6, c->n_experts_used, c->n_experts);
    printf("layers:         %d, hidden %d, ffn %d, heads %d (kv %d, head_dim %d), vocab %d\n",
           c->n_layers, c->hidden_size, c->intermediate_size, c->n_heads, c->n_kv_heads, c->head_dim,
           c->vocab_size);
    if (c->kv_lora_rank > 0)
        printf("MLA:            q %s, latent %d + rope key %d cached per token, q/k head %d (nope %d + rope "
               "%d), v head %d\n",
               c->q_lora_rank > 0 ? "low-rank" : "full rank", c->kv_lora_rank, c->rope_dim, c->head_dim,
               c->qk_nope_head_dim, c->rope_dim, c->v_head_dim);
    if (n_moe) {
        printf("experts:        %d MoE layers of %d (the others dense); %d experts of ffn %d, top %d per "
               "token, %s scores, %s%s\n",
               n_moe, c->n_layers, c->n_experts, c->moe_intermediate_size, c->n_experts_used,
               c->moe_scoring == KAON_MOE_SIGMOID ? "sigmoid" : "softmax",
               c->norm_topk_prob ? "weights renormalised over the top-k" : "weights not renormalised",
               c->moe_score_bias ? ", selection bias" : "");
        if (c->moe_n_group > 1)
            printf("routing groups: best %d of %d groups (group score: %s)\n", c->moe_topk_group, c->moe_n_group,
                   c->moe_group_top2 ? "sum of its best two" : "its best expert");
        if (c->moe_routed_scale != 1.0f) printf("routed scale:   %g\n", c->moe_routed_scale);
        if (c->shared_expert_intermediate_size > 0)
            printf("shared expert:  ffn %d, every token%s\n", c->shared_expert_intermediate_size,
                   c->shared_expert_gated ? ", sigmoid-gated" : "");
    }
    printf("context:        %d tokens\n", c->max_position_embeddings);
    printf("rope:           theta %g, %d dims, %s%s\n", c->rope_theta, c->rope_dim,
           c->rope_interleaved ? "interleaved pairs" : "NeoX halves",
           c->rope_scaling == KAON_ROPE_SCALING_LLAMA3 ? ", llama3 scaling"
           : c->rope_scaling == KAON_ROPE_SCALING_LINEAR ? ", linear scaling"
           : c->rope_scaling == KAON_ROPE_SCALING_YARN ? ", YaRN scaling" : "");
    printf("embeddings:     %s\n", c->tie_word_embeddings ? "tied (LM head = token embedding)" : "separate LM head");
    if (m->quant.method != KAON_QUANT_NONE) {
        char qd[160];
        printf("quantization:   %s (%s), from %s; %d module patterns left unquantized\n", m->quant.method_name,
               kaon_quant_describe(&m->quant, qd, sizeof qd), m->quant.source, m->quant.n_ignore);
    }
    printf("weight formats:");
    for (int t = 0; t < KAON_MAX_DTYPE_IDS; t++)
        if (wc.tensors_by_dtype[t])
            printf(" %s x%llu (%.1f M params, %.1f MiB)", kaon_dtype_name((kaon_dtype)t),
                   (unsigned long long)wc.tensors_by_dtype[t], wc.params_by_dtype[t] / 1e6,
                   wc.bytes_by_dtype[t] / 1048576.0);
    printf("\n");
    // One line per row of the architecture's weight table.
    printf("weights (%s table):\n", m->arch->label);
    for (int i = 0; i < m->arch->n_weights; i++) {
        const kaon_weight_spec *s = &m->arch->weights[i];
        if (!rows[i].tensors) continue;
        // The name as the file spells it, with N for the layer.
        const char *fmt = m->gguf ? s->gguf : s->hf;
        char name[160];
        snprintf(name, sizeof name, "%s", fmt ? fmt : s->gguf);
        char *d = strstr(name, "%d");
        if (d) memmove(d + 1, d + 2, strlen(d + 2) + 1), *d = 'N';
        printf("  %-42s x%-4llu %8.2f M params %9.2f MiB ", name,
               (unsigned long long)rows[i].tensors, rows[i].params / 1e6, rows[i].bytes / 1048576.0);
        for (int t = 0; t < KAON_MAX_DTYPE_IDS; t++)
            if (rows[i].dtype_mask >> t & 1) printf(" %s", kaon_dtype_name((kaon_dtype)t));
        printf("\n");
    }
    free(rows);
    if (meta) print_file_types(meta);
    const size_t kv_tok = kaon_model_kv_bytes_per_token(m, 4), kv_gpu = kaon_model_kv_bytes_per_token(m, 2);
    printf("memory:         weights %.1f MiB (%s)\n", m->weight_bytes / 1048576.0,
           m->format == KAON_FORMAT_DUMMY ? "bf16, created by the device backend" : "mapped in place");
    const size_t kv_f8 = kaon_model_kv_bytes_per_token(m, 1);
    printf("KV cache:       %zu B/token in bf16 (GPU), %zu B/token in f32 (CPU); the full context of %d "
           "tokens: %.1f MiB (bf16); 1 GiB holds %zu tokens (bf16); %zu B/token in fp8_e4m3 "
           "(--kv-cache-dtype fp8): 1 GiB holds %zu tokens\n",
           kv_gpu, kv_tok, c->max_position_embeddings, (double)kv_gpu * c->max_position_embeddings / 1048576.0,
           ((size_t)1 << 30) / kv_gpu, kv_f8, ((size_t)1 << 30) / kv_f8);
    if (o.dp > 1) print_replicas(m, &o);
    int rc = o.tp > 1 ? print_tensor_parallel(m, &o) : 0;
    if (o.expert_load && !rc) {
        fflush(stdout);
        rc = expert_load(m, &o);
    }
    kaon_model_free(m);
    kaon_gguf_close(meta);
    return rc;
}
