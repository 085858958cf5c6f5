// The GGUF metadata keys every architecture shares (llama.cpp writes them as <arch>.<key>).
#include "model/gguf_config.h"

#include <stdio.h>
#include <string.h>

#include "model/arch.h"
#include "util/err.h"

int64_t kaon_gguf_arch_int(const kaon_gguf *g, const kaon_model_config *c, const char *key, int64_t dflt) {
    char full[256];
    snprintf(full, sizeof full, "%s.%s", c->arch_name, key);
    return kaon_gguf_get_int(g, full, dflt);
}

double kaon_gguf_arch_float(const kaon_gguf *g, const kaon_model_config *c, const char *key, double dflt) {
    char full[256];
    snprintf(full, sizeof full, "%s.%s", c->arch_name, key);
    return kaon_gguf_get_float(g, full, dflt);
}

int kaon_gguf_config(const kaon_gguf *g, kaon_model_config *c) {
    kaon_model_config_init(c);
    kaon_gguf_str s;
    if (!kaon_gguf_get_str(g, "general.architecture", &s))
        return kaon_set_error("GGUF file has no general.architecture");
    if (s.len >= sizeof c->arch_name) s.len = sizeof c->arch_name - 1;
    memcpy(c->arch_name, s.ptr, s.len);
    c->arch_name[s.len] = 0;
    c->impl = kaon_arch_find(c->arch_name, &c->arch);
    if (!c->impl) return kaon_model_config_validate(c);
    c->n_layers = (int)kaon_gguf_arch_int(g, c, "block_count", 0);
    c->hidden_size = (int)kaon_gguf_arch_int(g, c, "embedding_length", 0);
    c->intermediate_size = (int)kaon_gguf_arch_int(g, c, "feed_forward_length", 0);
    c->n_heads = (int)kaon_gguf_arch_int(g, c, "attention.head_count", 0);
    c->n_kv_heads = (int)kaon_gguf_arch_int(g, c, "attention.head_count_kv", c->n_heads);
    c->head_dim = (int)kaon_gguf_arch_int(g, c, "attention.key_length",
                                          c->n_heads > 0 ? c->hidden_size / c->n_heads : 0);
    c->rope_dim = (int)kaon_gguf_arch_int(g, c, "rope.dimension_count", c->head_dim);
    c->max_position_embeddings = (int)kaon_gguf_arch_int(g, c, "context_length", 2048);
    c->rms_norm_eps = (float)kaon_gguf_arch_float(g, c, "attention.layer_norm_rms_epsilon", 1e-5);
    c->rope_theta = (float)kaon_gguf_arch_float(g, c, "rope.freq_base", 10000.0);
    enum kaon_gguf_type et;
    uint64_t n_tokens = 0;
    if (kaon_gguf_get_array(g, "tokenizer.ggml.tokens", &et, &n_tokens)) c->vocab_size = (int)n_tokens;
    c->vocab_size = (int)kaon_gguf_arch_int(g, c, "vocab_size", c->vocab_size);
    kaon_gguf_str st;
    char full[256];
    snprintf(full, sizeof full, "%s.rope.scaling.type", c->arch_name);
    if (kaon_gguf_get_str(g, full, &st) && !kaon_gguf_str_eq(st, "none")) {
        if (kaon_gguf_str_eq(st, "linear")) {
            c->rope_scaling = KAON_ROPE_SCALING_LINEAR;
            c->rope_factor = (float)kaon_gguf_arch_float(g, c, "rope.scaling.factor", 1.0);
        } else if (kaon_gguf_str_eq(st, "yarn")) {
            // llama.cpp writes DeepSeek's mscale_all_dim as yarn_log_multiplier = 0.1 * it, and
            // scales cos/sin by nothing (mscale == mscale_all_dim).
            c->rope_scaling = KAON_ROPE_SCALING_YARN;
            c->rope_factor = (float)kaon_gguf_arch_float(g, c, "rope.scaling.factor", 1.0);
            c->rope_original_max_pos = (int)kaon_gguf_arch_int(g, c, "rope.scaling.original_context_length",
                                                               c->max_position_embeddings);
            c->rope_beta_fast = (float)kaon_gguf_arch_float(g, c, "rope.scaling.yarn_beta_fast", 32.0);
            c->rope_beta_slow = (float)kaon_gguf_arch_float(g, c, "rope.scaling.yarn_beta_slow", 1.0);
            c->rope_mscale_all_dim = (float)(kaon_gguf_arch_float(g, c, "rope.scaling.yarn_log_multiplier", 0.0) / 0.1);
            c->rope_mscale = c->rope_mscale_all_dim;
            c->rope_attn_factor = c->rope_mscale_all_dim != 0.0f ? 1.0f : kaon_yarn_attn_factor(c);
            if (!(c->rope_factor > 0.0f) || c->rope_original_max_pos <= 0)
                return kaon_set_error("GGUF yarn rope scaling needs a positive factor and original context length");
        } else {
            return kaon_set_error("unsupported GGUF rope scaling type '%.*s'", (int)st.len, st.ptr);
        }
    }
    c->tie_word_embeddings = kaon_gguf_find_tensor(g, "output.weight") == NULL;
    c->bos_token_id = (int)kaon_gguf_get_int(g, "tokenizer.ggml.bos_token_id", -1);
    int eos = (int)kaon_gguf_get_int(g, "tokenizer.ggml.eos_token_id", -1);
    if (eos >= 0) c->eos_token_ids[c->n_eos_token_ids++] = eos;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "gguf");
    if (c->impl->gguf_config && c->impl->gguf_config(g, c)) return -1;
    return kaon_model_config_validate(c);
}
