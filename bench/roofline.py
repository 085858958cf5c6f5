"""What one decode step must read, per architecture, for the rooflines the GPU benches print.

Dense (Llama, Qwen, Mistral): every weight once per step. Mixture of experts (Mixtral, Qwen-MoE,
DeepSeek): the attention, dense layers, routers, shared experts and LM head once, plus the routed
experts the step's tokens touch: top_k of them at batch 1, and for a batch of B tokens the
expected number of distinct experts under uniform routing, E (1 - (1 - k/E)^B) (126 of 128 at
B = 64, k = 8): a batched MoE step reads nearly the whole model. MLA (DeepSeek) caches one latent
row (kv_lora + rope) per token and layer instead of K and V per head. Weights are bf16 unless the
config's quantization_config says otherwise: then the linear layers (attention, MLPs, experts) take
the format's bytes per element with its scales (quant_elem_bytes), while the embedding, the LM
head, the norms and the routers stay bf16, as the checkpoints keep them.

  python3 bench/roofline.py bench/configs/deepseek-ai__DeepSeek-V2-Lite.json --ctx 1024 --batch 1 64

Prefill (--prefill): the FLOPs of one prompt (prefill_flops: the matrices each token goes
through, the LM head on the last row only, causal attention) over a `kaon bench latency` result's
prefill time, as a fraction of PREFILL_FLOPS (issue 22's prefill-8k bar):

  python3 bench/roofline.py CONFIG --prefill OUT/latency_prefill_8192.json

Serving (serving_roofline): prefill at PREFILL_FLOPS plus decode steps that stream the weights
and the in-flight contexts at the copy bandwidth; --serve prints it beside each level of a
bench/serve.py result (bench/gpu_sweep.sh does):

  python3 bench/roofline.py CONFIG --serve OUT/serve-*.json --bw 4.8e12
"""
import argparse
import json
from pathlib import Path


def text_config(cfg):
    return cfg.get("text_config") or cfg


def _moe_layers(c):
    E = c.get("n_routed_experts") or c.get("num_experts") or c.get("num_local_experts") or 0
    if not E:
        return E, []
    L = c["num_hidden_layers"]
    if "first_k_dense_replace" in c:  # DeepSeek
        return E, [l for l in range(L) if l >= c["first_k_dense_replace"]]
    only = set(c.get("mlp_only_layers") or [])
    step = c.get("decoder_sparse_step") or 1
    return E, [l for l in range(L) if l not in only and (l + 1) % step == 0]


def shape(cfg):
    """Parameter counts of one step's parts (elements, not bytes)."""
    c = text_config(cfg)
    d, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    nh = c["num_attention_heads"]
    if "kv_lora_rank" in c:  # MLA
        nope, rope, vh, kvl = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
        ql = c.get("q_lora_rank") or 0
        q = d * ql + ql + ql * nh * (nope + rope) if ql else d * nh * (nope + rope)
        attn = q + d * (kvl + rope) + kvl + nh * (nope + vh) * kvl + nh * vh * d
        kv_per_token = L * (kvl + rope)
    else:
        nkv = c.get("num_key_value_heads") or nh
        hd = c.get("head_dim") or d // nh
        attn = d * nh * hd + 2 * d * nkv * hd + nh * hd * d
        kv_per_token = L * 2 * nkv * hd
    E, moe = _moe_layers(c)
    k = c.get("num_experts_per_tok") or 0
    fe = c.get("moe_intermediate_size") or c.get("intermediate_size")
    shared = 0
    if c.get("n_shared_experts"):
        shared = 3 * d * fe * c["n_shared_experts"]
    elif c.get("shared_expert_intermediate_size"):
        shared = 3 * d * c["shared_expert_intermediate_size"] + d
    dense_mlp = 3 * d * c["intermediate_size"]
    fixed = L * (attn + 2 * d) + (L - len(moe)) * dense_mlp + len(moe) * (E * d + shared) + V * d + d
    plain = L * 2 * d + len(moe) * E * d + V * d + d  # norms, routers, LM head: never quantized
    return dict(
        layers=L, moe_layers=len(moe), experts=E, top_k=k, expert=3 * d * fe, fixed=fixed, plain=plain,
        embed_row=d, kv_per_token=kv_per_token, attn=attn, dense_mlp=dense_mlp, shared=shared)


def quant_elem_bytes(cfg, elem=2):
    """Bytes per element of the quantized linear layers, scales included (elem when none)."""
    q = cfg.get("quantization_config") or text_config(cfg).get("quantization_config")
    if not q:
        return elem
    m = q.get("quant_method")
    if m == "fp8":
        b = q.get("weight_block_size") or [1 << 30, 1 << 30]
        return 1 + 4 / (b[0] * b[1])
    if m in ("awq", "gptq"):
        g = q.get("group_size") or 128
        zero = m == "gptq" or q.get("zero_point", True)
        return q.get("bits", 4) / 8 + 2 / g + (0.5 / g if zero else 0)
    if m == "mxfp4":
        return 0.5 + 1 / 32
    if m == "compressed-tensors":
        w = next(iter(q.get("config_groups", {}).values()), {}).get("weights") or {}
        bits, g = w.get("num_bits", 16), w.get("group_size") or 0
        return bits / 8 + (2 / g if g else 0)
    return elem


def experts_touched(E, k, batch):
    """Expected distinct experts of one layer that batch tokens choose (uniform routing)."""
    return E * (1 - (1 - k / E) ** batch) if E else 0.0


def step_bytes(cfg, batch=1, elem=2, kv_elem=None):
    """Weight bytes one decode step of `batch` tokens reads, and KV bytes per cached token
    (kv_elem: bytes per cached element, elem by default; 1 for an FP8 cache)."""
    s = shape(cfg)
    experts = s["moe_layers"] * experts_touched(s["experts"], s["top_k"], batch) * s["expert"]
    q = quant_elem_bytes(cfg, elem)
    w = elem * (s["plain"] + batch * s["embed_row"]) + q * (s["fixed"] - s["plain"] + experts)
    return w, (kv_elem or elem) * s["kv_per_token"]


def active_params(cfg):
    """Parameters one token goes through (FLOPs of a prefill: 2 x this x tokens)."""
    s = shape(cfg)
    return s["fixed"] + s["moe_layers"] * s["top_k"] * s["expert"]


def decode_roofline(cfg, bw, ctx, batch=1):
    """Output tok/s if every step streamed its bytes at bw: batch x bw / (weights + KV of batch contexts)."""
    w, kv = step_bytes(cfg, batch)
    return batch * bw / (w + batch * kv * ctx), w + batch * kv * ctx


PREFILL_FLOPS = 790e12  # H200 bf16 dense tensor-core rate the prefill bars use


def prefill_flops(cfg, tokens):
    """FLOPs of a prefill of `tokens` tokens (one sequence, no cached prefix): 2 x the matrices each
    token goes through (the LM head on the last row only, as the engine computes it), plus causal
    attention, 4 x head_dim x heads x layers x tokens (tokens + 1) / 2 (QK^T and PV; MLA counted with
    its query/key width and its value width)."""
    c = text_config(cfg)
    s = shape(cfg)
    head = c["vocab_size"] * c["hidden_size"]
    # active_params counts the LM head and the norms' weights, which are no matrices here.
    mats = active_params(cfg) - head - c["hidden_size"] * (1 + 2 * s["layers"])
    nh = c["num_attention_heads"]
    if "kv_lora_rank" in c:
        width = c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"]
    else:
        width = 2 * (c.get("head_dim") or c["hidden_size"] // nh)
    attn = 2 * width * nh * s["layers"] * tokens * (tokens + 1) / 2
    return 2 * mats * tokens + 2 * head + attn


def serving_seconds(cfg, requests, in_flight, prompt, output, bw, kv_elem=None):
    """The roofline's time for `requests` requests of prompt + output tokens, in_flight at a time:
    (prefill seconds, every prompt at PREFILL_FLOPS; decode seconds, every step streaming its
    weights and the contexts in flight, half-way through their outputs on average, at bw bytes/s)."""
    w, kv_tok = step_bytes(cfg, in_flight, kv_elem=kv_elem)
    step = (w + in_flight * kv_tok * (prompt + output / 2)) / bw
    prefill = 2 * active_params(cfg) * prompt * requests / PREFILL_FLOPS
    return prefill, requests / in_flight * output * step


def serving_roofline(cfg, requests, in_flight, prompt, output, bw, kv_elem=None):
    """Output tok/s of those requests at the roofline (serving_seconds)."""
    return requests * output / sum(serving_seconds(cfg, requests, in_flight, prompt, output, bw, kv_elem))


def serve_levels(cfg, result, bw, kv_elem=None):
    """Rows of a bench/serve.py result: each level's output tok/s beside its serving roofline."""
    rows = []
    for r in result["runs"]:
        n = r["completed"]
        if not n:
            continue
        c = min(int(r["max_concurrency"] or n), n)
        pre, dec = serving_seconds(cfg, n, c, r["total_input_tokens"] / n, r["total_output_tokens"] / n, bw, kv_elem)
        roof = r["total_output_tokens"] / (pre + dec)
        row = dict(concurrency=c, requests=n, failed=r["failed"], output_tok_s=r["output_throughput"],
                   roofline_tok_s=roof, fraction=r["output_throughput"] / roof,
                   ttft_p50_ms=r["median_ttft_ms"], ttft_p99_ms=r["p99_ttft_ms"], tpot_p50_ms=r["median_tpot_ms"],
                   roofline_prefill_s=pre, roofline_decode_s=dec)
        if r.get("server_steps"):  # kaon's own split of the level's steps, beside the roofline's
            row["server_steps"] = r["server_steps"]
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--serve", default=None, help="a bench/serve.py result JSON: its levels beside their rooflines")
    ap.add_argument("--prefill", default=None, help="a `kaon bench latency` result JSON (batch 1): its prefill "
                    "in TFLOP/s and as a fraction of PREFILL_FLOPS")
    ap.add_argument("--kv-elem", type=int, default=None, help="bytes per cached element (1: an FP8 cache)")
    ap.add_argument("--ctx", type=float, default=1024)
    ap.add_argument("--batch", type=int, nargs="*", default=[1])
    ap.add_argument("--bw", type=float, default=4.257e12, help="copy bandwidth, bytes/s (H200 measured 4.257 TB/s)")
    a = ap.parse_args()
    cfg = json.loads(Path(a.config).read_text())
    if a.prefill:
        res = json.loads(Path(a.prefill).read_text())
        n, t = res["input_len"], res["results"][0]["avg_prefill_s"]
        f = prefill_flops(cfg, n)
        print(f"prefill of {n} tokens: {f / 1e12:.2f} TFLOP in {t:.4f} s = {f / t / 1e12:.0f} TFLOP/s = "
              f"{100 * f / t / PREFILL_FLOPS:.1f}% of {PREFILL_FLOPS / 1e12:.0f}")
        print(json.dumps(dict(kind="prefill_roofline", tokens=n, prefill_s=t, tflop=f / 1e12,
                              tflop_s=f / t / 1e12, fraction=f / t / PREFILL_FLOPS)))
        return
    if a.serve:
        print(f"serving roofline: prefill at {PREFILL_FLOPS / 1e12:.0f} TFLOP/s + decode steps at {a.bw / 1e12:.3f} TB/s")
        print(f"{'clients':>8} {'requests':>8} {'failed':>6} {'output tok/s':>12} {'roofline':>9} {'fraction':>8} "
              f"{'TTFT p50 ms':>11} {'TTFT p99 ms':>11} {'TPOT p50 ms':>11}")
        for r in serve_levels(cfg, json.loads(Path(a.serve).read_text()), a.bw, a.kv_elem):
            print(f"{r['concurrency']:>8} {r['requests']:>8} {r['failed']:>6} {r['output_tok_s']:>12.0f} "
                  f"{r['roofline_tok_s']:>9.0f} {r['fraction'] * 100:>7.1f}% {r['ttft_p50_ms']:>11.0f} "
                  f"{r['ttft_p99_ms']:>11.0f} {r['tpot_p50_ms']:>11.1f}")
            print(json.dumps(dict(r, kind="serve_roofline", bw_TBs=a.bw / 1e12)))
        return
    s = shape(cfg)
    print(json.dumps(dict(s, active_params=active_params(cfg))))
    for b in a.batch:
        roof, nbytes = decode_roofline(cfg, a.bw, a.ctx, b)
        print(f"batch {b}: {nbytes / 1e9:.2f} GB per step, roofline {roof:.0f} tok/s "
              f"({experts_touched(s['experts'], s['top_k'], b):.1f} experts per MoE layer)")


if __name__ == "__main__":
    main()
