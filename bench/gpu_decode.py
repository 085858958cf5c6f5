#!/usr/bin/env python3
"""Batch-1 decode (and prefill) speed of `kaon run --device cuda` on dummy bf16 weights of a
real config, with the HBM roofline measured in the same run.

roofline tok/s = copy bandwidth (device-to-device, bytes read + written, torch) / bytes read per
decoded token (bench/roofline.py: every weight a token goes through -- for MoE the attention,
dense layers, routers, shared and top-k routed experts --, the LM head, one embedding row, and the
KV cache of the average context, a latent row per layer for MLA). Prints one JSON line per run
and a table.

  python3 bench/gpu_decode.py --kaon build/kaon --config bench/configs/meta-llama__Llama-3.1-8B.json

A 4-bit weight-only config (e.g. bench/configs/llama-3.1-8b-awq-g128.json) runs dummy INT4 layers;
its roofline counts the dense linears at 4 bits plus kaon's f32 group scales and zeros, and a
second figure the checkpoint format's bytes (f16 scales, 4-bit zeros): the W4A16 bar.

--layers N runs the config cut to its first N layers; --project-layers M also runs N - 1 layers
and projects the full model's ms/token from the last layer's time (e.g. DeepSeek-V3 at 5 layers,
3 dense + 2 MoE, projected to 61).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import roofline  # noqa: E402


def copy_bandwidth(gib=4, reps=10):
    import torch
    n = gib << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    a.random_(0, 255)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        b.copy_(a)
    e.record()
    torch.cuda.synchronize()
    bw = 2 * n * reps / (s.elapsed_time(e) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return bw


def int4_format(cfg):
    """(group size, zero points) of a 4-bit weight-only config (awq, gptq, compressed-tensors
    pack-quantized), else None."""
    q = (cfg.get("text_config") or cfg).get("quantization_config") or {}
    m = q.get("quant_method")
    if m in ("awq", "gptq") and q.get("bits") == 4:
        return q.get("group_size") or 128, bool(q.get("zero_point")) if m == "awq" else not q.get("sym", True)
    if m == "compressed-tensors":
        for grp in (q.get("config_groups") or {}).values():
            w = grp.get("weights") or {}
            if w.get("num_bits") == 4 and w.get("type") == "int":
                return w.get("group_size") or 128, not w.get("symmetric", True)
    return None


def bytes_per_token(cfg, ctx, int4_bytes="kaon"):
    """Weight bytes a batch-1 decode step reads, and the KV bytes of ctx cached positions
    (roofline.step_bytes: quantized linears at their checkpoint format's bytes). INT4 configs with
    int4_bytes "kaon": the dense linears at what kaon reads instead, half a byte per weight plus
    8 bytes per row and group of g (an f32 scale and a zero, symmetric formats too), or 4 with
    KAON_T4_SZ16=1 (an f16 scale and a bf16 zero; the checkpoint: f16 scale + 4-bit zero)."""
    w, kv = roofline.step_bytes(cfg, 1)
    fmt = int4_format(cfg)
    if fmt and int4_bytes == "kaon":
        g, _ = fmt
        s = roofline.shape(cfg)
        lin = s["layers"] * s["attn"] + (s["layers"] - s["moe_layers"]) * s["dense_mlp"]
        per_group = 4 if os.environ.get("KAON_T4_SZ16") == "1" else 8
        w += lin * (0.5 + per_group / g - roofline.quant_elem_bytes(cfg))
    return w, kv * ctx


def cut_config(config, layers, td):
    """A copy of config with its first `layers` layers (text_config for wrappers)."""
    cfg = json.loads(Path(config).read_text())
    (cfg.get("text_config") or cfg)["num_hidden_layers"] = layers
    p = Path(td) / f"cut{layers}.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def run_kaon(kaon, config, prompt_len, n_new, env_extra=None, tp=1):
    ids = ",".join(str(1000 + (i * 7919) % 30000) for i in range(prompt_len))
    cmd = [kaon, "run", "--device", "cuda", "--load-format", "dummy", "-m", config, "--prompt-ids", ids,
           "-n", str(n_new), "--temp", "0", "--ignore-eos", "--print-ids",
           "--ctx-size", str(prompt_len + n_new + 16)] + (["-tp", str(tp)] if tp > 1 else [])
    env = dict(os.environ, **(env_extra or {}))
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    wall = time.time() - t0
    if p.returncode != 0:
        raise RuntimeError(f"kaon failed ({p.returncode}): {p.stderr[-2000:]}")
    return dict(run_figures(p.stderr), wall_s=wall, ids=json.loads(p.stdout.strip().splitlines()[-1]))


def run_figures(stderr):
    """The figures `kaon run` prints on stderr: its speed line, and the host's share of a decode step."""
    m = re.search(r"prompt (\d+) tokens in ([\d.]+) s \(([\d.]+) tok/s\); generated (\d+) tokens, ([\d.]+) tok/s",
                  stderr)
    if not m:
        raise RuntimeError(f"no speed line in kaon's output: {stderr[-2000:]}")
    h = re.search(r"decode steps, ([\d.]+) us each, of which ([\d.]+) us on the host", stderr)
    return dict(prompt_tokens=int(m.group(1)), prefill_s=float(m.group(2)), prefill_tok_s=float(m.group(3)),
                generated=int(m.group(4)), decode_tok_s=float(m.group(5)),
                host_us_per_step=float(h.group(2)) if h else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kaon", default=str(REPO / "build" / "kaon"))
    ap.add_argument("--config", default=str(REPO / "bench/configs/meta-llama__Llama-3.1-8B.json"))
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prefill", type=int, nargs="*", default=[],
                    help="also time prefill of prompts of these lengths (1 generated token)")
    ap.add_argument("--no-graphs", action="store_true", help="also run with KAON_CUDA_GRAPHS=0")
    ap.add_argument("--no-pdl", action="store_true", help="also run with KAON_PDL=0 (no programmatic dependent launch)")
    ap.add_argument("--json", default=None, help="append result lines here")
    ap.add_argument("--tp", type=int, default=1, help="tensor parallel ranks (-tp N: GPUs 0..N-1)")
    ap.add_argument("--layers", type=int, default=0, help="run the config cut to its first N layers")
    ap.add_argument("--project-layers", type=int, default=0,
                    help="with --layers N: also run N - 1 layers and project M layers' ms/token")
    a = ap.parse_args()
    td = tempfile.mkdtemp()
    full = a.config
    if a.layers:
        a.config = cut_config(full, a.layers, td)
    cfg = json.loads(Path(a.config).read_text())
    bw = copy_bandwidth() * a.tp  # -tp N reads its weights and KV from N GPUs at once
    rows = []
    variants = [("graphs", None)] + ([("no-graphs", {"KAON_CUDA_GRAPHS": "0"})] if a.no_graphs else []) + \
        ([("no-pdl", {"KAON_PDL": "0"})] if a.no_pdl else [])
    for name, env in variants:
        r = run_kaon(a.kaon, a.config, a.prompt_len, a.tokens, env, a.tp)
        ctx = a.prompt_len + a.tokens / 2
        w, kv = bytes_per_token(cfg, ctx)
        roof = bw / (w + kv)
        extra = {}
        if int4_format(cfg):  # the W4A16 bar: the checkpoint format's bytes (f16 scales, 4-bit zeros)
            wc, _ = bytes_per_token(cfg, ctx, "checkpoint")
            extra = dict(int4_checkpoint_roofline_tok_s=bw / (wc + kv),
                         int4_checkpoint_fraction=r["decode_tok_s"] / (bw / (wc + kv)))
        rows.append(dict(extra, kind="decode", variant=name, config=Path(a.config).name, batch=1, tp=a.tp,
                         prompt=a.prompt_len, tokens=r["generated"], decode_tok_s=r["decode_tok_s"],
                         ms_per_token=1e3 / r["decode_tok_s"], roofline_tok_s=roof,
                         roofline_fraction=r["decode_tok_s"] / roof, copy_bw_TBs=bw / 1e12,
                         bytes_per_token_GB=(w + kv) / 1e9, startup_and_run_wall_s=r["wall_s"],
                         host_us_per_step=r["host_us_per_step"],
                         first_ids=r["ids"][:8]))
    if a.layers and a.project_layers:
        r1 = run_kaon(a.kaon, cut_config(full, a.layers - 1, td), a.prompt_len, a.tokens)
        ms_n, ms_n1 = rows[0]["ms_per_token"], 1e3 / r1["decode_tok_s"]
        per_layer = ms_n - ms_n1
        proj = ms_n + (a.project_layers - a.layers) * per_layer
        fcfg = json.loads(Path(full).read_text())
        w, kv = bytes_per_token(fcfg, a.prompt_len + a.tokens / 2)
        rows.append(dict(kind="projection", config=Path(full).name, layers_run=[a.layers, a.layers - 1],
                         ms_per_token=[ms_n, ms_n1], last_layer_ms=per_layer, projected_layers=a.project_layers,
                         projected_ms_per_token=proj, projected_tok_s=1e3 / proj,
                         full_model_roofline_tok_s=bw / (w + kv),
                         projected_fraction=1e3 / proj / (bw / (w + kv))))
    for plen in a.prefill:
        r = run_kaon(a.kaon, a.config, plen, 1)
        L, d, nh = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
        hd = cfg.get("head_dim") or d // nh
        flops = 2 * roofline.active_params(cfg) * plen + 4 * L * nh * hd * plen * plen / 2  # matrices + causal attention
        rows.append(dict(kind="prefill", config=Path(a.config).name, prompt=plen, prefill_s=r["prefill_s"],
                         prefill_tok_s=r["prefill_tok_s"], tflops=flops / r["prefill_s"] / 1e12,
                         fraction_of_790_tflops=flops / r["prefill_s"] / 790e12, wall_s=r["wall_s"]))
    for row in rows:
        print(json.dumps(row))
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(dict(row, date=time.strftime("%Y-%m-%d %H:%M"))) + "\n")
    print(f"\ncopy bandwidth {bw / 1e12:.3f} TB/s (read + write)")
    for row in rows:
        if row["kind"] == "projection":
            print(f"projection: {row['layers_run'][0]} layers {row['ms_per_token'][0]:.3f} ms/token, "
                  f"{row['layers_run'][1]} layers {row['ms_per_token'][1]:.3f}: last layer {row['last_layer_ms']:.3f} ms; "
                  f"{row['projected_layers']} layers ~ {row['projected_ms_per_token']:.2f} ms/token = "
                  f"{row['projected_tok_s']:.1f} tok/s, {row['projected_fraction'] * 100:.1f}% of the full model's "
                  f"roofline {row['full_model_roofline_tok_s']:.1f}")
        elif row["kind"] == "decode":
            print(f"decode  {row['variant']:9s} {row['decode_tok_s']:8.1f} tok/s  {row['ms_per_token']:.3f} ms/token  "
                  f"roofline {row['roofline_tok_s']:.1f} tok/s  fraction {row['roofline_fraction'] * 100:.1f}%  "
                  f"(wall incl. start-up {row['startup_and_run_wall_s']:.1f} s)"
                  + (f"  host {row['host_us_per_step']:.1f} us/step" if row.get("host_us_per_step") is not None else ""))
            if "int4_checkpoint_fraction" in row:
                print(f"        INT4: roofline of the checkpoint's bytes (f16 scales, 4-bit zeros) "
                      f"{row['int4_checkpoint_roofline_tok_s']:.1f} tok/s, fraction "
                      f"{row['int4_checkpoint_fraction'] * 100:.1f}%")
        else:
            print(f"prefill {row['prompt']:6d} tokens {row['prefill_s']:.3f} s  {row['prefill_tok_s']:.0f} tok/s  "
                  f"{row['tflops']:.0f} TFLOP/s = {row['fraction_of_790_tflops'] * 100:.1f}% of 790")


if __name__ == "__main__":
    main()
