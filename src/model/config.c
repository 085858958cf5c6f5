#include "model/config.h"

#include <math.h>
#include <string.h>

#include "model/arch.h"
#include "util/err.h"

void kaon_model_config_init(kaon_model_config *c) {
    memset(c, 0, sizeof *c);
    c->arch = KAON_ARCH_UNKNOWN;
    c->rms_norm_eps = 1e-6f;
    c->rope_theta = 10000.0f;
    c->rope_factor = 1.0f;
    c->bos_token_id = -1;
    c->gen_temperature = -1.0f;
    c->gen_top_p = -1.0f;
    c->gen_top_k = -1;
    c->gen_min_p = -1.0f;
    c->gen_repetition_penalty = -1.0f;
    c->gen_max_new_tokens = -1;
    c->decoder_sparse_step = 1;
    c->moe_routed_scale = 1.0f;
    c->rope_attn_factor = 1.0f;
}

double kaon_yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

float kaon_yarn_attn_factor(const kaon_model_config *c) {
    if (c->rope_mscale != 0.0f && c->rope_mscale_all_dim != 0.0f)
        return (float)(kaon_yarn_mscale(c->rope_factor, c->rope_mscale) /
                       kaon_yarn_mscale(c->rope_factor, c->rope_mscale_all_dim));
    return (float)kaon_yarn_mscale(c->rope_factor, 1.0);
}

#define CHECK_RANGE(field, lo, hi)                                                              \
    if (!(c->field >= (lo) && c->field <= (hi)))                                                \
        return kaon_set_error("model config: %s = %g is out of range [%g, %g]", #field,         \
                              (double)c->field, (double)(lo), (double)(hi));

int kaon_model_config_validate(const kaon_model_config *c) {
    if (!c->impl || c->arch == KAON_ARCH_UNKNOWN)
        return kaon_set_error("unsupported architecture '%s' (kaon knows: %s)",
                              c->arch_name[0] ? c->arch_name : "(none given)", kaon_arch_supported());
    CHECK_RANGE(n_layers, 1, 1024);
    CHECK_RANGE(hidden_size, 1, 1 << 17);
    CHECK_RANGE(intermediate_size, 1, 1 << 20);
    CHECK_RANGE(n_heads, 1, 1024);
    CHECK_RANGE(n_kv_heads, 1, c->n_heads);
    CHECK_RANGE(head_dim, 2, 1024);
    CHECK_RANGE(vocab_size, 1, 1 << 24);
    CHECK_RANGE(rms_norm_eps, 0, 1);
    CHECK_RANGE(rope_theta, 1e-3, 1e12);
    CHECK_RANGE(rope_dim, 2, c->head_dim);
    if (c->n_heads % c->n_kv_heads)
        return kaon_set_error("model config: %d attention heads are not a multiple of %d KV heads",
                              c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2 || c->rope_dim % 2)
        return kaon_set_error("model config: head_dim %d and rope dims %d must be even",
                              c->head_dim, c->rope_dim);
    if (c->max_position_embeddings <= 0)
        return kaon_set_error("model config: max_position_embeddings must be positive");
    if (c->n_experts) {
        CHECK_RANGE(n_experts, 1, 4096);
        CHECK_RANGE(n_experts_used, 1, c->n_experts < 64 ? c->n_experts : 64);
        CHECK_RANGE(moe_intermediate_size, 1, 1 << 20);
        CHECK_RANGE(shared_expert_intermediate_size, 0, 1 << 20);
        CHECK_RANGE(decoder_sparse_step, 1, 1024);
    }
    return 0;
}

bool kaon_config_layer_is_moe(const kaon_model_config *c, int l) {
    if (c->n_experts <= 0 || l < 0) return false;
    if (kaon_layer_bit(c->mlp_only_layers, l)) return false;
    const int step = c->decoder_sparse_step > 0 ? c->decoder_sparse_step : 1;
    return (l + 1) % step == 0;
}
