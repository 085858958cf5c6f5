// kaon info: what a model is and what it needs.
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/load.h"

static void count_format(const kaon_tensor *t, uint64_t *bytes_by_type, uint64_t *n_by_type) {
    if (!t->data) return;
    bytes_by_type[t->dtype] += t->nbytes;
    n_by_type[t->dtype]++;
}

int kaon_cmd_info(int argc, char **argv) {
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: kaon info [MODEL]   (GGUF file or Hugging Face folder; default model if absent)\n");
            return 0;
        }
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (i + 1 >= argc) return kaon_cli_fail("-m needs a value");
            path = argv[++i];
        } else if (argv[i][0] == '-') {
            return kaon_cli_fail("unknown option '%s'", argv[i]);
        } else {
            path = argv[i];
        }
    }
    kaon_model *m = kaon_cli_load_model(path);
    if (!m) return 2;
    const kaon_model_config *c = &m->cfg;
    uint64_t bytes[64] = {0}, counts[64] = {0};
    count_format(&m->tok_embd, bytes, counts);
    count_format(&m->out_norm, bytes, counts);
    if (m->lm_head.data != m->tok_embd.data) count_format(&m->lm_head, bytes, counts);
    for (int l = 0; l < c->n_layers; l++) {
        const kaon_tensor *ts = &m->layers[l].attn_norm;
        for (size_t k = 0; k < sizeof m->layers[l] / sizeof(kaon_tensor); k++) count_format(&ts[k], bytes, counts);
    }
    printf("model:          %s\n", m->path);
    printf("format:         %s\n", m->format == KAON_FORMAT_GGUF ? "GGUF" : "safetensors (Hugging Face folder)");
    printf("architecture:   %s (%s)\n", c->arch_name, kaon_arch_label(c->arch));
    printf("parameters:     %.1f M (%llu)\n", m->n_params / 1e6, (unsigned long long)m->n_params);
    printf("layers:         %d, hidden %d, ffn %d, heads %d (kv %d, head_dim %d), vocab %d\n",
           c->n_layers, c->hidden_size, c->intermediate_size, c->n_heads, c->n_kv_heads, c->head_dim,
           c->vocab_size);
    printf("context:        %d tokens\n", c->max_position_embeddings);
    printf("rope:           theta %g, %d dims, %s%s\n", c->rope_theta, c->rope_dim,
           c->rope_interleaved ? "interleaved pairs (GGUF llama Q/K permutation)" : "NeoX halves",
           c->rope_scaling == KAON_ROPE_SCALING_LLAMA3 ? ", llama3 scaling"
           : c->rope_scaling == KAON_ROPE_SCALING_LINEAR ? ", linear scaling" : "");
    printf("embeddings:     %s\n", c->tie_word_embeddings ? "tied (LM head = token embedding)" : "separate LM head");
    printf("weight formats:");
    for (int t = 0; t < 64; t++)
        if (counts[t]) printf(" %s x%llu (%.1f MiB)", kaon_dtype_name((kaon_dtype)t),
                              (unsigned long long)counts[t], bytes[t] / 1048576.0);
    printf("\n");
    size_t kv_tok = kaon_model_kv_bytes_per_token(m, 4);
    printf("memory:         weights %.1f MiB (mapped in place); KV cache %.1f KiB/token (f32), "
           "%.1f MiB at the full context\n",
           m->weight_bytes / 1048576.0, kv_tok / 1024.0,
           (double)kv_tok * c->max_position_embeddings / 1048576.0);
    kaon_model_free(m);
    return 0;
}
