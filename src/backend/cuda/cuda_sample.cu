// Sampling on the GPU: one block of 1,024 threads per row of f32 logits, so that only token
// ids (and a logprob when asked) cross to the host instead of vocab-sized rows.
//
// A row's edits (logit_bias / masks, repetition, presence and frequency penalties) are
// applied in place. Greedy rows take the first maximum. Other rows find their cut-off as the
// host sampler defines it: top_k's k-th largest logit and top_p's smallest head of mass are
// found by radix selection over the logits' order-preserving 32-bit keys (4 passes of 8-bit
// digit histograms each), min_p is a threshold on the logit. The draw is Gumbel-max over the
// kept tokens: argmax((l - max) / T - log(-log u_i)) is an exact sample of their softmax, and
// u_i = hash(rng_key, i) makes the result independent of the other rows.
#include "backend/cuda/cuda_internal.h"

#include <math.h>
#include <string.h>

#define SMP_THREADS 1024
#define SMP_WARPS (SMP_THREADS / 32)

struct kc_sampler {
    void *dev;        // rows, entry tokens, entry values; then ids and logprobs
    size_t dev_cap;   // bytes
    void *host;       // pinned staging of the same layout
    size_t host_cap;  // bytes
};

static __device__ __forceinline__ uint32_t fkey(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ float uniform01(uint64_t key, uint32_t i) {
    uint64_t z = key + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return ((float)(z >> 40) + 0.5f) * (1.0f / 16777216.0f);  // (0, 1)
}

// Block-wide reductions (every thread gets the result). red must hold SMP_WARPS entries and
// is free again when the call returns.
static __device__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = lane < SMP_WARPS ? red[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    __syncthreads();
    return s;
}

// Largest value, first index on ties (torch.argmax's choice).
static __device__ void block_argmax(float &v, int &idx, float *redv, int *redi) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx)) {
            v = ov;
            idx = oi;
        }
    }
    if (lane == 0) {
        redv[warp] = v;
        redi[warp] = idx;
    }
    __syncthreads();
    v = lane < SMP_WARPS ? redv[lane] : -INFINITY;
    idx = lane < SMP_WARPS ? redi[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx)) {
            v = ov;
            idx = oi;
        }
    }
    __syncthreads();
}

// Among bins 255..0 (highest first), the bin where the running total first reaches `need`,
// and the total of the bins above it; warp 0 computes, the block reads from *out_bin and
// *out_above. A total that never reaches need picks the lowest non-empty bin.
template <typename T>
static __device__ void pick_bin(const T *hist, T need, int *out_bin, T *out_above) {
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        // lane owns bins 255 - 8*lane - j, j = 0..7 (lane 0 the highest).
        T mine = 0;
        for (int j = 0; j < 8; j++) mine += hist[255 - 8 * lane - j];
        T incl = mine;  // inclusive prefix over lanes 0..lane
        for (int o = 1; o < 32; o <<= 1) {
            const T up = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += up;
        }
        const T excl = incl - mine;
        const unsigned hit = __ballot_sync(0xffffffffu, incl >= need && mine > 0);
        const unsigned nonempty = __ballot_sync(0xffffffffu, mine > 0);
        const int src = hit ? __ffs(hit) - 1 : (nonempty ? 31 - __clz(nonempty) : 0);
        if (lane == src) {
            T acc = excl, above = excl, last_above = excl;
            int bin = -1, last = -1;
            for (int j = 0; j < 8; j++) {
                const int b = 255 - 8 * lane - j;
                const T hb = hist[b];
                if (hb > 0) {
                    if (acc + hb >= need) {
                        bin = b;
                        above = acc;
                        break;
                    }
                    last = b;
                    last_above = acc;
                }
                acc += hb;
            }
            if (bin < 0) {  // not reached (rounding, or nothing left): the lowest non-empty bin
                bin = last >= 0 ? last : 255 - 8 * lane;
                above = last >= 0 ? last_above : excl;
            }
            *out_bin = bin;
            *out_above = above;
        }
    }
    __syncthreads();
}

// The k-th largest key of the row (k >= 1): keys >= it are the top k (ties may add more).
static __device__ uint32_t kth_largest_key(const float *L, int V, int k, int *hist, int *bin_s,
                                           int *above_s) {
    uint32_t prefix = 0, mask = 0;
    int need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += SMP_THREADS) hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
            const uint32_t key = fkey(L[i]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
        }
        __syncthreads();
        pick_bin<int>(hist, need, bin_s, above_s);
        need -= *above_s;
        prefix |= (uint32_t)*bin_s << shift;
        mask |= 255u << shift;
        __syncthreads();
    }
    return prefix;
}

// The key at which the mass of the kept tokens (key >= cut), taken from the top, first
// reaches `need`: the smallest head of the distribution with that mass.
static __device__ uint32_t mass_head_key(const float *L, int V, uint32_t cut, float mx, float invT,
                                         float need, float *hist, int *bin_s, float *above_s) {
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += SMP_THREADS) hist[i] = 0.f;
        __syncthreads();
        for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
            const float l = L[i];
            const uint32_t key = fkey(l);
            if (key >= cut && (key & mask) == prefix)
                atomicAdd(&hist[(key >> shift) & 255], __expf((l - mx) * invT));
        }
        __syncthreads();
        pick_bin<float>(hist, need, bin_s, above_s);
        need -= *above_s;
        prefix |= (uint32_t)*bin_s << shift;
        mask |= 255u << shift;
        __syncthreads();
    }
    return prefix;
}

__global__ void __launch_bounds__(SMP_THREADS)
k_sample(float *__restrict__ logits, int V, const kaon_sample_row *__restrict__ rows,
         const int32_t *__restrict__ etok, const float *__restrict__ eval, int32_t *__restrict__ ids,
         float *__restrict__ lps) {
    __shared__ float redv[SMP_WARPS];
    __shared__ int redi[SMP_WARPS];
    __shared__ int hist_i[256];
    __shared__ float hist_f[256];
    __shared__ int bin_s, above_i;
    __shared__ float above_f;
    const kaon_sample_row R = rows[blockIdx.x];
    float *L = logits + (size_t)R.logit_row * V;
    const int tid = threadIdx.x;

    // Edits, in the host's order. Bias entries one after another (duplicates add up); the
    // penalty lists hold distinct tokens, so their threads never meet.
    if (tid == 0)
        for (int e = 0; e < R.n_bias; e++) {
            const int t = etok[R.bias_off + e];
            if (t >= 0 && t < V) L[t] += eval[R.bias_off + e];
        }
    __syncthreads();
    if (R.repetition != 1.0f)
        for (int e = tid; e < R.n_seen; e += SMP_THREADS) {
            const int t = etok[R.seen_off + e];
            if (t < 0 || t >= V) continue;
            const float x = L[t];
            L[t] = x > 0.f ? x / R.repetition : x * R.repetition;
        }
    __syncthreads();
    if (R.presence != 0.0f || R.frequency != 0.0f)
        for (int e = tid; e < R.n_out; e += SMP_THREADS) {
            const int t = etok[R.out_off + e];
            if (t < 0 || t >= V) continue;
            const float c = eval[R.out_off + e];
            L[t] -= (c > 0.f ? R.presence : 0.f) + R.frequency * c;
        }
    __syncthreads();

    float mx = -INFINITY;
    int am = 0x7fffffff;
    for (int i = tid; i < V; i += SMP_THREADS) {
        const float l = L[i];
        if (l > mx) {  // i grows per thread: the first maximum of the thread's elements
            mx = l;
            am = i;
        }
    }
    block_argmax(mx, am, redv, redi);
    if (am == 0x7fffffff) am = 0;  // every logit masked
    int chosen = am;
    if (R.temperature > 0.0f && R.top_k != 1 && mx > -INFINITY) {
        const float T = R.temperature, invT = 1.0f / T;
        uint32_t cut = 0;
        if (R.top_k > 0 && R.top_k < V) cut = kth_largest_key(L, V, R.top_k, hist_i, &bin_s, &above_i);
        if (R.min_p > 0.0f) {
            const uint32_t c = fkey(mx + T * logf(R.min_p));
            cut = c > cut ? c : cut;
        }
        if (R.top_p < 1.0f) {
            float z = 0.f;
            for (int i = tid; i < V; i += SMP_THREADS) {
                const float l = L[i];
                if (fkey(l) >= cut) z += __expf((l - mx) * invT);
            }
            z = block_sum(z, redv);
            const uint32_t head = mass_head_key(L, V, cut, mx, invT, R.top_p * z, hist_f, &bin_s, &above_f);
            cut = head > cut ? head : cut;
        }
        float best = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = tid; i < V; i += SMP_THREADS) {
            const float l = L[i];
            if (fkey(l) < cut || l == -INFINITY) continue;
            const float s = (l - mx) * invT - __logf(-__logf(uniform01(R.rng_key, (uint32_t)i)));
            if (s > best) {
                best = s;
                bi = i;
            }
        }
        block_argmax(best, bi, redv, redi);
        chosen = bi == 0x7fffffff ? am : bi;
    }
    if (R.want_logprob) {
        float s = 0.f;
        for (int i = tid; i < V; i += SMP_THREADS) s += __expf(L[i] - mx);
        s = block_sum(s, redv);
        if (tid == 0) lps[blockIdx.x] = L[chosen] - mx - logf(s);
    }
    if (tid == 0) ids[blockIdx.x] = chosen;
}

static size_t align16(size_t x) { return (x + 15) & ~(size_t)15; }

void kc_sampler_free(kc_backend *b) {
    kc_sampler *s = b->sampler;
    if (!s) return;
    if (s->dev) cudaFree(s->dev);
    if (s->host) cudaFreeHost(s->host);
    free(s);
    b->sampler = NULL;
}

int kc_sample(kc_backend *b, float *logits, int vocab, const kaon_sample_batch *sb, int32_t *ids,
              float *logprobs) {
    const int n = sb->n_rows, ne = sb->n_entries;
    if (n <= 0) return 0;
    if (b->capturing) return kc_fail(b, "cuda: sample while recording a graph");
    if (!b->sampler && !(b->sampler = (kc_sampler *)calloc(1, sizeof(kc_sampler))))
        return kc_fail(b, "cuda: out of host memory");
    kc_sampler *s = b->sampler;
    const size_t o_rows = 0, o_tok = align16(sizeof(kaon_sample_row) * n);
    const size_t o_val = o_tok + align16(sizeof(int32_t) * (size_t)ne);
    const size_t o_ids = o_val + align16(sizeof(float) * (size_t)ne);
    const size_t o_lps = o_ids + align16(sizeof(int32_t) * n);
    const size_t total = o_lps + align16(sizeof(float) * n);
    if (total > s->dev_cap) {
        if (s->dev) cudaFree(s->dev);
        s->dev = NULL;
        s->dev_cap = 0;
        if (kc_check(b, cudaMalloc(&s->dev, total * 2), "sampler buffers")) return -1;
        s->dev_cap = total * 2;
    }
    if (total > s->host_cap) {
        if (s->host) cudaFreeHost(s->host);
        s->host = NULL;
        s->host_cap = 0;
        if (kc_check(b, cudaMallocHost(&s->host, total * 2), "sampler staging")) return -1;
        s->host_cap = total * 2;
    }
    char *h = (char *)s->host, *d = (char *)s->dev;
    memcpy(h + o_rows, sb->rows, sizeof(kaon_sample_row) * n);
    if (ne) {
        memcpy(h + o_tok, sb->entry_token, sizeof(int32_t) * (size_t)ne);
        memcpy(h + o_val, sb->entry_value, sizeof(float) * (size_t)ne);
    }
    if (kc_check(b, cudaMemcpyAsync(d, h, o_ids, cudaMemcpyHostToDevice, b->stream), "sampler input")) return -1;
    k_sample<<<n, SMP_THREADS, 0, b->stream>>>(logits, vocab, (const kaon_sample_row *)(d + o_rows),
                                               (const int32_t *)(d + o_tok), (const float *)(d + o_val),
                                               (int32_t *)(d + o_ids), (float *)(d + o_lps));
    if (kc_launched(b, "sample")) return -1;
    if (kc_check(b, cudaMemcpyAsync(h + o_ids, d + o_ids, total - o_ids, cudaMemcpyDeviceToHost, b->stream),
                 "sampled ids") ||
        kc_check(b, cudaStreamSynchronize(b->stream), "step"))
        return -1;
    memcpy(ids, h + o_ids, sizeof(int32_t) * n);
    if (logprobs) memcpy(logprobs, h + o_lps, sizeof(float) * n);
    return 0;
}
