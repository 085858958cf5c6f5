// The backend contract: the op table is the only way a model computes. A model passes
// weights (kaon_tensor, any stored format; the linear and moe ops take whole layers,
// kaon_linear: weight, bias, format companions, parts) and activation buffers (void *, in the
// backend's activation dtype: f32 on the CPU) that it got from the backend's own allocator.
// A linear op given a layer its kernels cannot compute (a format companion it has no kernel
// for: kaon_linear_unsupported) fails with an error naming the format, never guesses.
#ifndef KAON_BACKEND_BACKEND_H
#define KAON_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/linear.h"
#include "backend/tensor.h"

typedef struct kaon_backend kaon_backend;

typedef struct kaon_rope {
    int rot_dim;             // rotated dims per head (the first rot_dim of head_dim)
    bool interleaved;        // pairs (2j, 2j+1); else NeoX pairs (j, j + rot_dim/2)
    const float *inv_freq;   // [rot_dim/2], scaling (llama3, linear) already applied
} kaon_rope;

// How a KV cache stores its elements: the backend's activation dtype (CPU f32, CUDA bf16), or
// FP8 e4m3fn, one byte each: code = e4m3(x / scale) (round to nearest even, saturated at
// +-448), read back as e4m3 * scale, with one f32 scale per layer for K and one for V.
enum { KAON_KV_NATIVE = 0, KAON_KV_FP8 = 1 };

// Where a weight sits in the whole tensor it is a part of (a tensor-parallel shard): indices
// [lo, lo + shape[dim]) along dim of a tensor whose extent there is full, every other
// dimension whole. fill_dummy gives each element the value of its place in the whole, so
// random weights are the same numbers however a model is split.
typedef struct kaon_dummy_origin {
    int dim;
    int64_t lo, full;
} kaon_dummy_origin;

// One layer's paged KV cache: K and V are [n_blocks, block_size, n_kv_heads, head_dim].
typedef struct kaon_kv_layer {
    void *k;
    void *v;
    int dtype;               // KAON_KV_NATIVE or KAON_KV_FP8
    float k_scale, v_scale;  // FP8 only (1.0 unless the checkpoint gives them)
} kaon_kv_layer;

// Attention metadata of one flat batch (prefill chunks and decodes mixed). Token t of
// sequence s = token_seq[t] sits at position positions[t]; it attends to positions
// 0..positions[t] of s, all of which are in the cache once kv_write has run for this step.
// The cache slot of position p of s is block_tables[s*max_blocks + p/block_size]*block_size
// + p%block_size.
typedef struct kaon_attn_meta {
    int n_tokens;
    int n_seqs;
    const int32_t *positions;     // [n_tokens]
    const int32_t *token_seq;     // [n_tokens]
    const int32_t *slot_mapping;  // [n_tokens] slot of each new token's K/V
    const int32_t *block_tables;  // [n_seqs, max_blocks]
    int max_blocks;
    int block_size;
} kaon_attn_meta;

// Sampling on the device (only token ids cross to the host). Row r of a step samples from
// logit row rows[r].logit_row after its edits, applied in this order: bias entries (added; a
// -inf bias masks), HF repetition penalty over the seen tokens, then presence and frequency
// penalties over the output tokens with their counts. Then temperature, top_k, min_p and
// top_p (over what top_k and min_p kept, renormalised) as the host sampler does, and one draw
// from the rest; the draw's randomness comes from rng_key alone (batch-invariant).
typedef struct kaon_sample_row {
    int32_t logit_row;
    float temperature;  // <= 0: greedy (the first maximum)
    int32_t top_k;      // <= 0: off
    float top_p;        // >= 1: off
    float min_p;        // <= 0: off
    uint64_t rng_key;
    float repetition, presence, frequency;  // 1, 0, 0: off
    int32_t bias_off, n_bias;  // entries [bias_off, +n_bias): (token, value)
    int32_t seen_off, n_seen;  // entries: (token, -) the repetition penalty applies to
    int32_t out_off, n_out;    // entries: (token, count) of the output
    int32_t want_logprob;      // logprob of the chosen id under the raw logits (no edits then)
} kaon_sample_row;

typedef struct kaon_sample_batch {
    int n_rows;
    const kaon_sample_row *rows;
    int n_entries;
    const int32_t *entry_token;  // [n_entries]
    const float *entry_value;    // [n_entries] bias value or output count
} kaon_sample_batch;

// How an MoE router scores experts (kaon_moe_weights.scoring).
enum { KAON_MOE_SOFTMAX = 0, KAON_MOE_SIGMOID = 1 };

// One mixture-of-experts MLP layer as the moe op sees it. Experts are given one by one ([E]
// arrays of layers over 2-D weights) so stacked GGUF tensors, per-expert safetensors and fused
// gate_up tensors all reach a backend as the same kind of view; each is a kaon_linear, so a
// format with scales can carry them per expert.
typedef struct kaon_moe_weights {
    int n_experts;              // E
    int top_k;                  // experts per token
    bool norm_topk;             // renormalise the top-k routing probabilities to sum to 1
    const kaon_linear *router;  // [E, dim]: routing logits = x @ router^T, softmax over E
    const kaon_linear *gate;    // [E] of [ffn, dim]
    const kaon_linear *up;      // [E] of [ffn, dim]
    const kaon_linear *down;    // [E] of [dim, ffn]
    // A shared expert every token goes through (Qwen2-MoE), NULL when absent, scaled by
    // sigmoid(x @ shared_gate_inp^T) when that is given.
    const kaon_linear *shared_gate, *shared_up;  // [sffn, dim]
    const kaon_linear *shared_down;              // [dim, sffn]
    const kaon_linear *shared_gate_inp;          // [1, dim] or NULL
    // DeepSeekMoE routing (defaults, all zero: softmax, no bias, no groups, no factor).
    // scores s = softmax(logits) or sigmoid(logits); choice c = s + score_bias (bias: [E] f32,
    // for selection only); with n_group > 1 only the topk_group best groups of E/n_group
    // experts compete (a group's score: its best c, or with group_top2 the sum of its best
    // two), the others' c count as -inf; the top_k c are taken, their weights
    // are s (renormalised when norm_topk), times routed_scale (0: 1).
    int scoring;                     // KAON_MOE_SOFTMAX or KAON_MOE_SIGMOID
    const kaon_tensor *score_bias;   // [E] f32, or NULL
    int n_group, topk_group;
    bool group_top2;
    float routed_scale;
    // The experts' activation: KAON_MOE_ACT_SILU (silu(g) * u), or gpt-oss's clamped SwiGLU
    // (g = min(g, limit), u = clamp(u, -limit, limit), (u + 1) * g * sigmoid(alpha * g));
    // expert views may carry biases (kaon_linear.bias) with either.
    int act;
    float act_alpha, act_limit;
    // Expert parallelism (model/tp.h): this rank computes experts [e0, e1) only; every token is
    // still routed over all E (the same choice on every rank) and the other experts' weights are
    // not read. e1 == 0: all of them. The CPU and CUDA backends' ops honour it (CUDA: not with FP8 experts).
    int e0, e1;
} kaon_moe_weights;

enum { KAON_MOE_ACT_SILU = 0, KAON_MOE_ACT_SWIGLU_OAI = 1 };

typedef struct kaon_backend_ops {
    const char *name;
    // Activation and KV memory (bytes); zero-filled.
    void *(*alloc)(kaon_backend *be, size_t bytes);
    void (*free)(kaon_backend *be, void *p);
    size_t act_elem_bytes;  // bytes per activation element (4 on the CPU)

    // out[i] = table[ids[i]]                     table [vocab, dim] -> out [n, dim]
    void (*embed)(kaon_backend *be, const kaon_tensor *table, const int32_t *ids, int n,
                  void *out);
    // out[i] = x[idx[i]]                          x [*, dim] -> out [n, dim]
    void (*get_rows)(kaon_backend *be, const void *x, const int32_t *idx, int n, int dim,
                     void *out);
    // When add != NULL: x += add (the residual stream, in place). Then
    // out = x / rms(x) * w.                       x, add, out [n, dim]; w [dim]
    // out may be x itself (in-place norm, used for Qwen3's per-head q/k norm).
    void (*rmsnorm)(kaon_backend *be, void *x, const void *add, const kaon_tensor *w, float eps,
                    int n, int dim, void *out);
    // As rmsnorm, with x / rms(x) * w computed in f32 and rounded to the activation dtype once
    // (Gemma's RMSNorm), where rmsnorm rounds x / rms(x) before w multiplies it (Llama's). NULL:
    // the backend's activations are f32 (the two are the same), rmsnorm serves.
    void (*rmsnorm_once)(kaon_backend *be, void *x, const void *add, const kaon_tensor *w, float eps,
                         int n, int dim, void *out);
    // y = x @ w->w^T (+ w->bias)                   x [n, in]; w->w [out, in]; bias [out]; y [n, out]
    // (a fused weight's parts are the columns of y in order). Errors: kaon_last_error, status.
    void (*linear)(kaon_backend *be, const void *x, int n, const kaon_linear *w, void *y);
    // Rotates the first rot_dim of each head in place.   x [n, n_heads, head_dim]
    void (*rope)(kaon_backend *be, void *x, int n, int n_heads, int head_dim,
                 const int32_t *positions, const kaon_rope *rope);
    // Stores this step's K and V at their slots.  k, v [n_tokens, n_kv_heads, head_dim]
    // v may be NULL for a cache without V (MLA: kv->v is NULL; the latent row is K and V).
    void (*kv_write)(kaon_backend *be, kaon_kv_layer *kv, const void *k, const void *v,
                     const kaon_attn_meta *m, int n_kv_heads, int head_dim);
    // Causal paged attention with GQA.             q, out [n_tokens, n_heads, head_dim]
    // window 0: the token at position p attends to positions 0..p of its sequence. window > 0
    // (sliding-window layers, Gemma 3): to the positions k with p - window < k <= p, i.e. the
    // last `window` keys, p's own included, as HF transformers' sliding_window_overlay
    // (kv_idx > q_idx - sliding_window, and-ed with the causal kv_idx <= q_idx). Blocks that
    // hold no position of any token's window are never read (their table entries may be -1).
    void (*attention)(kaon_backend *be, const void *q, const kaon_kv_layer *kv,
                      const kaon_attn_meta *m, int n_heads, int n_kv_heads, int head_dim,
                      float scale, int window, void *out);
    // As attention, with a learned logit per query head (sinks [n_heads] f32, gpt-oss) added to
    // each softmax's denominator only: out = sum_p e^(s_p) v_p / (e^sink + sum_p e^(s_p)).
    // NULL: the backend cannot run models with attention sinks.
    void (*attention_sinks)(kaon_backend *be, const void *q, const kaon_kv_layer *kv,
                            const kaon_attn_meta *m, int n_heads, int n_kv_heads, int head_dim,
                            float scale, int window, const float *sinks, void *out);
    // Multi-head latent attention (DeepSeek's MLA, absorbed form): causal paged attention over
    // one cached row per token, [kv_lora + rope_dim] = the normed latent c then the rotated
    // shared key k_pe (kv_write with n_kv_heads 1, head_dim kv_lora + rope_dim). Every head
    // attends with K = the whole row and V = its first kv_lora values:
    //   out[t,h] = sum_p softmax_p(scale * q[t,h] . row_p) * row_p[0:kv_lora]
    // q [n_tokens, n_heads, kv_lora + rope_dim] (q_nope absorbed into the latent, then q_pe);
    // out [n_tokens, n_heads, kv_lora]. NULL: the backend cannot run MLA models.
    void (*mla_attention)(kaon_backend *be, const void *q, const kaon_kv_layer *kv,
                          const kaon_attn_meta *m, int n_heads, int kv_lora, int rope_dim,
                          float scale, void *out);
    // MLA prefill chunks may run expanded (model/blocks_mla.c: each head's keys and values
    // from the cached latents, then this backend's attention op with head_dim qk_nope +
    // qk_rope): set where the attention op takes that width.
    bool mla_expanded_prefill;
    // Which ops take a KAON_KV_FP8 cache: kv_fp8 for kv_write, rope_kv_write and attention(_sinks);
    // kv_fp8_mla for the MLA ops (mla_prep, mla_attention). A model is refused an FP8 cache
    // on a backend without them.
    bool kv_fp8, kv_fp8_mla;
    // Per-head matrices: y[t, h, 0:out] = x[t, h, 0:in] @ w_h^T for h < n_heads, t < n, where
    // w->w is [n_heads * out, in] (head h: rows [h out, (h+1) out)), no bias or companions. x and y are strided
    // activations (elements between tokens, between heads), so a head's slice of a wider row
    // is read or written in place (MLA's absorbed W_UK and W_UV).
    void (*head_linear)(kaon_backend *be, const void *x, int n, int n_heads, size_t x_tok,
                        size_t x_head, const kaon_linear *w, void *y, size_t y_tok, size_t y_head);
    // dst[r * dst_stride + i] = s * src[r * src_stride + i] for r < rows, i < width (activations).
    void (*copy_strided)(kaon_backend *be, const void *src, size_t src_stride, void *dst,
                         size_t dst_stride, int rows, int width, float s);
    // out = silu(gate) * up                        gate, up, out [n, dim]; out may be gate
    void (*silu_and_mul)(kaon_backend *be, const void *gate, const void *up, int n, int dim,
                         void *out);
    // out = gelu_tanh(gate) * up, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    // (HF's gelu_pytorch_tanh)                     gate, up, out [n, dim]; out may be gate
    void (*gelu_tanh_and_mul)(kaon_backend *be, const void *gate, const void *up, int n, int dim,
                              void *out);
    // x *= s in place                              x [n] activations (Gemma's embedding scale)
    void (*scale)(kaon_backend *be, void *x, size_t n, float s);
    // logits = cap * tanh(logits / cap) over n f32 logits (from linear_f32, or the CPU's f32
    // activations): final logit soft-capping.
    void (*logit_softcap)(kaon_backend *be, float *logits, size_t n, float cap);
    // Copies n activation elements to host floats (logits out of the backend).
    void (*to_host_f32)(kaon_backend *be, const void *x, size_t n, float *out);
    void (*destroy)(kaon_backend *be);

    // ---- Optional ops (NULL where a backend has no use for them: the CPU and noop
    // backends use weights in place and run every op synchronously). ----

    // Copies a host weight into backend memory. dev gets the same shape, the backend's own
    // weight format (CUDA: matrices in bf16, vectors in f32; GGUF Q4_0/Q4_1/Q8_0/Q4_K/Q6_K
    // matrices stay quantized in cuda_quant.cu's layout unless KAON_CUDA_QUANT=0)
    // and data the backend owns (give it back with release). 0, or -1 + error.
    int (*upload)(kaon_backend *be, const kaon_tensor *host, kaon_tensor *dev);
    // As upload, but quantized blocks are always expanded to the dense format (CUDA: bf16):
    // for ops that read only that (the CUDA moe op's router and experts). NULL: upload does.
    int (*upload_dense)(kaon_backend *be, const kaon_tensor *host, kaon_tensor *dev);
    // Creates a weight of like->shape (like->data is not read) filled with reproducible
    // random values offset + uniform(-scale, scale) from seed and each element's flat index
    // in the whole tensor (origin: where like sits in it; NULL: like is whole); as upload
    // otherwise.
    int (*fill_dummy)(kaon_backend *be, const kaon_tensor *like, const kaon_dummy_origin *origin, uint64_t seed,
                      float scale, float offset, kaon_tensor *dev);
    // Copies a linear layer whose format has companions (FP8 with scales, INT4 with group
    // scales, zeros, a permutation) into backend memory in the backend's layout for that format:
    // dev->w and its companions share one allocation, so release(&dev->w) frees them all (the
    // bias is a weight of its own). dummy: host's data is not read; random codes and scales of
    // host's format and shape come from seed. NULL: such layers run on host backends only.
    int (*upload_linear)(kaon_backend *be, const kaon_linear *host, bool dummy, uint64_t seed, kaon_linear *dev);
    void (*release)(kaon_backend *be, kaon_tensor *dev);
    // Bytes a device copy of host takes (upload's format; dense: upload_dense's). NULL: the
    // host's bytes (backends that use weights in place).
    size_t (*weight_bytes)(kaon_backend *be, const kaon_tensor *host, bool dense);
    // Called once per forward pass before its first op, with the host arrays that the ops
    // of this pass will receive (tokens, m's arrays, logit_rows): a device backend copies
    // them in one transfer and then recognises the same host pointers in the ops.
    int (*begin_step)(kaon_backend *be, const int32_t *tokens, const kaon_attn_meta *m,
                      const int32_t *logit_rows, int n_logits);
    // Whole-step graphs. graph_begin(key): 1 = a graph recorded for key was launched (the
    // caller skips its ops up to graph_end); 0 = the caller issues its ops; 2 = the caller
    // issues its ops and they are recorded (so no host-side choice may depend on the step's
    // positions); -1 = error. key must name everything that fixes the ops' shapes
    // and buffers (the caller's buffers must not move while graphs exist).
    int (*graph_begin)(kaon_backend *be, uint64_t key);
    int (*graph_end)(kaon_backend *be);
    // The first error of an op that returns none (or of an asynchronous one) since the last
    // call: -1 + kaon_set_error, else 0. (The CPU's reports its linear and moe ops' errors.)
    int (*status)(kaon_backend *be);
    // Free and total bytes of the device's memory.
    int (*mem_info)(kaon_backend *be, size_t *free_bytes, size_t *total_bytes);

    // Logits in f32: y = x @ w->w^T into f32 backend memory ([n, out] floats, from alloc; a
    // layer with a bias is an error), and the copy of such f32 memory to the host. (bf16 logits
    // tie too often for greedy choices.)
    void (*linear_f32)(kaon_backend *be, const void *x, int n, const kaon_linear *w, float *y);
    void (*copy_f32_to_host)(kaon_backend *be, const float *x, size_t n, float *out);

    // Fused ops. Each returns 0 when done, 1 when it declines (the caller then runs the
    // unfused ops), -1 on error.
    // y[i] = x @ w[i]->w^T (+ w[i]->bias) for i < count (<= 4): one pass over x, several layers.
    int (*linear_multi)(kaon_backend *be, const void *x, int n, int count,
                        const kaon_linear *const *w, void *const *y);
    // out = silu(x @ gate->w^T) * (x @ up->w^T)     x [n, in]; out [n, ffn]
    // Declines (1) when gate or up has a bias.
    int (*linear_silu_mul)(kaon_backend *be, const void *x, int n, const kaon_linear *gate,
                           const kaon_linear *up, void *out);
    // linear_multi and linear_silu_mul of rmsnorm(x, NULL, norm, eps) (x the residual stream,
    // left as it is), without writing the normed rows: the same results as the two ops up to
    // rounding. A backend may take them only right after a linear_residual into x that named
    // this norm (it prepared the norm there), and declines (1) otherwise.
    int (*norm_linear_multi)(kaon_backend *be, const void *x, const kaon_tensor *norm, float eps, int n,
                             int count, const kaon_linear *const *w, void *const *y);
    int (*norm_linear_silu_mul)(kaon_backend *be, const void *x, const kaon_tensor *norm, float eps, int n,
                                const kaon_linear *gate, const kaon_linear *up, void *out);
    // res += x @ w->w^T (+ bias), the product rounded to the activation dtype first: linear into
    // a scratch, then rmsnorm's add of it into the residual stream res, as one op. next_norm (eps):
    // the norm of res that the next norm_linear_* call applies, which the op may prepare (the
    // CUDA backend at batch 1: no norm kernel between the GEMVs); NULL: none follows.
    int (*linear_residual)(kaon_backend *be, const void *x, int n, const kaon_linear *w, void *res,
                           const kaon_tensor *next_norm, float eps);
    // norm_linear_multi of q, k, v (w[3]: wq, wk, wv), then rope_kv_write of them, as one op (k's
    // and v's buffers are left unspecified). As norm_linear_multi: taken only right after a
    // linear_residual that prepared this norm; declines (1) otherwise.
    int (*norm_qkv_rope_kv_write)(kaon_backend *be, const void *x, const kaon_tensor *norm, float eps, int n,
                                  const kaon_linear *const *w, void *q, void *k, void *v, kaon_kv_layer *kv,
                                  const kaon_attn_meta *m, int n_heads, int n_kv_heads, int head_dim,
                                  const kaon_rope *rope);
    // rope(q) in place, then rope(k) and v stored at their slots (k's buffer is left
    // unspecified): rope + rope + kv_write in one.
    int (*rope_kv_write)(kaon_backend *be, void *q, void *k, const void *v, kaon_kv_layer *kv,
                         const kaon_attn_meta *m, int n_heads, int n_kv_heads, int head_dim,
                         const kaon_rope *rope);
    // Qwen3's per-head RMSNorm of q and k (weights q_norm, k_norm [head_dim], eps), then
    // rope_kv_write, as one op with the same result; 1: declined (the ops apart take it).
    int (*qk_norm_rope_kv_write)(kaon_backend *be, void *q, void *k, const void *v, const kaon_tensor *q_norm,
                                 const kaon_tensor *k_norm, float eps, kaon_kv_layer *kv, const kaon_attn_meta *m,
                                 int n_heads, int n_kv_heads, int head_dim, const kaon_rope *rope);

    // DeepSeek MLA's cache row and query rope part in one pass, as blocks.c's unfused sequence
    // computes them: kva [n, kvl + rd] = [latent | k_pe]; the row [bf16 RMSNorm(latent) * norm |
    // rope(k_pe)] goes to the token's cache slot; q [n, nh, hd]: each head's last rd dims,
    // rotated and rounded, times pe_scale, into qm [n, nh, kvl + rd] at column kvl (q itself
    // is left as it is). kva is left unspecified.
    int (*mla_prep)(kaon_backend *be, const void *kva, const kaon_tensor *norm, float eps, const void *q,
                    int n_heads, int head_dim, float pe_scale, void *qm, kaon_kv_layer *kv,
                    const kaon_attn_meta *m, int kv_lora, int rope_dim, const kaon_rope *rope);

    // Samples the rows of sb from f32 logits [*, vocab] (from linear_f32) into ids (host
    // memory, [n_rows]) and, where asked, logprobs; waits for the result. 0 or -1.
    int (*sample)(kaon_backend *be, const float *logits, int vocab, const kaon_sample_batch *sb,
                  int32_t *ids, float *logprobs);
    // Copies f32 logit rows rows[i] of x [*, n] to out + rows[i] * n (host).
    int (*copy_rows_f32_to_host)(kaon_backend *be, const float *x, int n, const int32_t *rows,
                                 int n_rows, float *out);

    // Mixture-of-experts MLP: each token t goes to the top_k experts of softmax(x_t @ router^T)
    // with weights p (renormalised when w->norm_topk), and
    //   out_t = sum_e p_e * down_e(silu(gate_e x_t) * up_e x_t)  (+ the shared expert)
    // Only the chosen experts' weights are read. x, out [n, dim] (out != x). positions: NULL or
    // the step's [n] (host array, as attention gets it): tokens at a negative position are
    // padding, routed nowhere and given out = 0. counts: NULL, or [E] uint32 counters in
    // backend memory (from alloc) that get += the tokens routed to each expert. 0, or -1.
    int (*moe)(kaon_backend *be, const void *x, int n, const int32_t *positions,
               const kaon_moe_weights *w, uint32_t *counts, void *out);
    // x += moe(rmsnorm(x, NULL, norm, eps)), the MoE output rounded to the activation dtype
    // before the add (rmsnorm's add), as norm_linear_* and linear_residual do around a dense MLP:
    // taken only right after a linear_residual into x that prepared this norm, and prepares
    // next_norm as linear_residual does (NULL: none). 1: declined, x and the prepared norm untouched
    // (scratch may have been sized); 0; -1.
    int (*norm_moe_residual)(kaon_backend *be, void *x, const kaon_tensor *norm, float eps, int n,
                             const int32_t *positions, const kaon_moe_weights *w, uint32_t *counts,
                             const kaon_tensor *next_norm);
    // dst[r * dst_stride + i] = src[r * src_stride + i] for r < rows, i < width: f32 backend
    // memory (tensor parallelism puts the ranks' logit slices side by side). NULL: host memory,
    // the caller copies.
    void (*copy_f32_strided)(kaon_backend *be, const float *src, size_t src_stride, float *dst,
                             size_t dst_stride, int rows, int width);
} kaon_backend_ops;

struct kaon_backend {
    const kaon_backend_ops *ops;
    int n_threads;
};

// The CPU backend: C on its own thread pool (util/pool.h); AVX-512 VNNI or AVX2/FMA/F16C chosen
// at run time, portable C otherwise.
kaon_backend *kaon_backend_cpu_create(int n_threads);
// A backend that computes nothing (for measuring the engine's own overhead).
kaon_backend *kaon_backend_noop_create(void);
// The CUDA backend (bf16 activations, bf16 or GGUF-quantized weights, f32 accumulation) on one
// GPU. Without CUDA in the build it returns NULL with the error "built without CUDA".
kaon_backend *kaon_backend_cuda_create(int device);
// What tensor parallelism (model/tp.c) needs of a CUDA backend whose rank runs on a thread of
// its own: its device and stream (a communicator enqueues its collectives there), making the
// calling thread's current device its own (CUDA's current device is per thread), waiting for
// its stream, and eager steps only (no graphs: a communicator with host barriers cannot be
// recorded). Without CUDA in the build: -1 + "built without CUDA".
int kaon_backend_cuda_device(kaon_backend *be, void **stream);
int kaon_backend_cuda_bind(kaon_backend *be);
int kaon_backend_cuda_sync(kaon_backend *be);
void kaon_backend_cuda_no_graphs(kaon_backend *be);

#endif
