// One description of a model, whatever file it came from: the architecture, its
// hyper-parameters, and the generation defaults. Filled from config.json (io/hf_config.c) or
// from GGUF metadata (model/config.c).
#ifndef KAON_MODEL_CONFIG_H
#define KAON_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kaon_arch {
    KAON_ARCH_UNKNOWN = 0,
    KAON_ARCH_LLAMA,    // LlamaForCausalLM, MistralForCausalLM, GGUF llama
    KAON_ARCH_QWEN2,    // Qwen2ForCausalLM: q/k/v biases
    KAON_ARCH_QWEN3,    // Qwen3ForCausalLM: per-head q/k RMSNorm
    KAON_ARCH_GEMMA3,   // Gemma3ForCausalLM (text): sliding-window layers, pre/post norms, GELU
    KAON_ARCH_DEEPSEEK2,  // DeepseekV2ForCausalLM (and GGUF deepseek2): MLA + DeepSeekMoE
    KAON_ARCH_DEEPSEEK3,  // DeepseekV3ForCausalLM, Kimi-K2 (kimi_k2), Kimi-K2.5's text model
    KAON_ARCH_GPTOSS,     // GptOssForCausalLM: attention sinks, clamped-SwiGLU experts with biases
    KAON_ARCH_PLUGIN,     // an architecture a plugin registered (model/plugin.c): impl says which
} kaon_arch;
// The enum names the variant an architecture file tells apart (model/arch.h: which file serves
// a name is the registry's business). The MoE variants map onto the attention family
// (MixtralForCausalLM and GGUF llama with expert_count -> LLAMA, Qwen2Moe/qwen2moe -> QWEN2,
// Qwen3Moe/qwen3moe -> QWEN3) and are told apart by n_experts > 0.
struct kaon_arch_ops;

#define KAON_MAX_MLP_ONLY_LAYERS 1024

typedef enum kaon_rope_scaling_type {
    KAON_ROPE_SCALING_NONE = 0,
    KAON_ROPE_SCALING_LINEAR,
    KAON_ROPE_SCALING_LLAMA3,
    KAON_ROPE_SCALING_YARN,
} kaon_rope_scaling_type;

typedef struct kaon_model_config {
    kaon_arch arch;
    const struct kaon_arch_ops *impl;  // the architecture file (model/arch.h); NULL: unknown
    char arch_name[64];  // as written in the file (e.g. "LlamaForCausalLM" or "llama")
    int n_layers;
    int hidden_size;
    int intermediate_size;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int vocab_size;
    int max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;
    int rope_dim;            // rotated dims per head (== head_dim unless partial)
    bool rope_interleaved;   // true: pairs (2j, 2j+1) (GGUF llama Q/K permutation); false: NeoX
    kaon_rope_scaling_type rope_scaling;
    float rope_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    int rope_original_max_pos;
    // YaRN (rope_scaling type yarn): the ramp between beta_fast and beta_slow rotations, and
    // the magnitude scales (HF: attention_factor multiplies cos/sin; DeepSeek's attention
    // multiplies its softmax scale by yarn_mscale(factor, mscale_all_dim)^2).
    float rope_beta_fast, rope_beta_slow;
    float rope_mscale, rope_mscale_all_dim;  // 0: not given
    float rope_attn_factor;                   // cos/sin multiplier; 1 unless YaRN sets it
    bool rope_yarn_no_truncate;               // yarn "truncate": false (gpt-oss): ramp ends not rounded
    bool tie_word_embeddings;
    bool attention_bias;     // q/k/v biases (Qwen2)
    bool qk_norm;            // per-head q/k RMSNorm (Qwen3)
    // Sliding-window attention (Gemma 3): layers in swa_layers attend to the last
    // sliding_window positions only and rotate with rope_local_theta.
    int sliding_window;
    uint64_t swa_layers[KAON_MAX_MLP_ONLY_LAYERS / 64];
    float rope_local_theta;
    float query_pre_attn_scalar;  // attention scale = query_pre_attn_scalar^-0.5 (0: head_dim)
    float final_logit_softcap;    // logits = c * tanh(logits / c) when > 0
    // Token ids (-1 when unknown). eos may list several (generation_config.json).
    int bos_token_id;
    int eos_token_ids[8];
    int n_eos_token_ids;
    // Generation defaults from generation_config.json (negative = unset).
    float gen_temperature;
    float gen_top_p;
    int gen_top_k;
    float gen_min_p;
    float gen_repetition_penalty;
    int gen_max_new_tokens;
    char torch_dtype[16];
    // Mixture of experts (model/moe.c); n_experts == 0: every layer is a dense MLP.
    int n_experts;               // routed experts of an MoE layer
    int n_experts_used;          // top-k per token
    int moe_intermediate_size;   // each expert's ffn width
    int shared_expert_intermediate_size;  // Qwen2-MoE's shared expert (0: none)
    bool norm_topk_prob;         // renormalise the top-k routing weights to sum to 1
    int decoder_sparse_step;     // layer l is MoE when (l + 1) % step == 0 (1: all)
    uint64_t mlp_only_layers[KAON_MAX_MLP_ONLY_LAYERS / 64];  // bit l: layer l stays dense
    bool shared_expert_gated;    // the shared expert is scaled by sigmoid(x . gate) (Qwen2-MoE)
    // DeepSeekMoE routing: scores (softmax or sigmoid), a per-expert bias added for selection
    // only (e_score_correction_bias), group-limited selection (the topk_group best of n_group
    // groups; a group's score is its best expert's, or the sum of its best two with the bias:
    // noaux_tc), and a factor on the final weights.
    int moe_scoring;             // KAON_MOE_SOFTMAX / KAON_MOE_SIGMOID (backend/backend.h)
    bool moe_score_bias;         // e_score_correction_bias present
    int moe_n_group, moe_topk_group;
    bool moe_group_top2;         // noaux_tc group scores (sum of top 2); else the group's max
    float moe_routed_scale;      // routed_scaling_factor (1: none)
    float moe_swiglu_limit;      // gpt-oss: the experts' clamped SwiGLU limit
    // MLA (DeepSeek-V2/V3): q through a low-rank q_a/q_b pair when q_lora_rank > 0; K and V
    // from a shared latent of kv_lora_rank plus one rotated key of rope_dim (qk_rope_head_dim);
    // head_dim = qk_nope_head_dim + rope_dim (the query/key width per head).
    int q_lora_rank, kv_lora_rank, qk_nope_head_dim, v_head_dim;
    int n_nextn_layers;          // MTP layers after the main ones (num_nextn_predict_layers)
    int n_mtp_layers;            // of those, loaded as the draft model of speculative decoding
                                 // (kaon_model_load_mtp): counted in n_layers, after the main ones
    int draft_vocab_size;        // an EAGLE-3 head (model/eagle3.h): its LM head's rows
    char hf_prefix[32];          // prefix of the text model's tensor names (Kimi-K2.5: "language_model.")
    // An architecture's own numbers that no field above holds, read by its hf_config (a
    // plugin's extra config.json keys: examples/plugin/ keeps its multipliers here).
    float arch_params[8];
} kaon_model_config;

void kaon_model_config_init(kaon_model_config *c);  // zeros + "unset" markers
kaon_arch kaon_arch_from_name(const char *name);    // HF class name or GGUF arch (model/registry.c)
const char *kaon_arch_label(kaon_arch a);
// Bit l of a layer set ([KAON_MAX_MLP_ONLY_LAYERS / 64] words).
static inline bool kaon_layer_bit(const uint64_t *set, int l) {
    return l >= 0 && l < KAON_MAX_MLP_ONLY_LAYERS && (set[l / 64] >> (l % 64) & 1);
}
// YaRN's magnitude correction 0.1 m ln(s) + 1 (1 when s <= 1), and the cos/sin multiplier HF
// derives from the config: yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
// when both are given, else yarn_mscale(factor, 1).
double kaon_yarn_mscale(double scale, double m);
float kaon_yarn_attn_factor(const kaon_model_config *c);
// Checks the hyper-parameters make sense (positive, divisible, bounded); -1 + error if not.
int kaon_model_config_validate(const kaon_model_config *c);
// Whether layer l's MLP is a mixture of experts (by the config: decoder_sparse_step and
// mlp_only_layers; a GGUF file says it per layer by the tensors it has).
bool kaon_config_layer_is_moe(const kaon_model_config *c, int l);

// Reads <dir>/config.json and, when present, <dir>/generation_config.json.
int kaon_hf_config_load(const char *dir, kaon_model_config *c);
// Parses config.json text (fuzzable).
int kaon_hf_config_parse(const char *json, size_t len, kaon_model_config *c);
int kaon_hf_generation_config_parse(const char *json, size_t len, kaon_model_config *c);

#endif
