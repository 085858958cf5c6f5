#!/usr/bin/env python3
"""Batch-1 decode of a quantized GGUF with `kaon run --device cuda`: writes a Llama-3.1-8B-shaped
GGUF of random blocks (Q4_0 matrices, Q6_K output and Q4_0 embedding by default: the types of
llama.cpp's Q4_0 files, whose llama-bench tg128 is 333 tok/s on the H200, /work/shared/ANCHORS.md)
and reports decode tok/s against the roofline of the quantized bytes.

roofline tok/s = bandwidth / bytes read per decoded token, bytes = every quantized matrix of
the layers and the LM head as stored, the f32 norms, one embedding row, and the bf16 KV cache of
the average context. bandwidth: the device-to-device copy measured with torch in the same run
(read + write), or --bw (default 4.30e12 when torch is missing).

  python3 bench/gpu_decode_gguf.py --kaon build/kaon [--qtype Q4_0] [--out-qtype Q6_K] [--tokens 128]

The GGUF's blocks are random bytes generated in block format (no quantization of floats) with
f16 scales kept small, so writing the 4.6 GB file takes seconds; --keep PATH reuses a file.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
QT = {"F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144), "Q6_K": (14, 256, 210)}
LLAMA_CPP_Q4_0_TG = 333.0  # tok/s, ANCHORS.md


def block_pool(rng, qname, n_blocks):
    """n_blocks blocks of a format with sane f16 scales (as tests/gpu/test_gpu.py's random_blocks:
    weights of about +-0.1, centred): 2^18 random blocks repeated (generating is the slow part)."""
    t, _, bsz = QT[qname]
    base = min(n_blocks, 1 << 18)
    if t == 1:  # F16: values, not blocks
        return np.resize((rng.standard_normal(base) * 0.02).astype(np.float16).view(np.uint8), n_blocks * bsz)
    raw = rng.integers(0, 256, (base, bsz), dtype=np.uint8)
    d = rng.uniform(0.5, 1.0, base)

    def put(off, v):
        raw[:, off:off + 2] = v.astype(np.float16).view(np.uint8).reshape(base, 2)
    if t == 2:
        put(0, 0.012 * d)
    elif t == 8:
        put(0, 0.002 * d)
    elif t == 3:
        put(0, 0.01 * d)
        put(2, -7.5 * 0.01 * d)
    elif t == 12:
        put(0, 0.0003 * d)
        put(2, 7.5 * 0.0003 * d)
    elif t == 14:
        put(208, 0.00008 * d)
    return np.resize(raw.reshape(-1), n_blocks * bsz)


def roles(cfg, qtype, out_qtype, embd_qtype):
    """Shape [rows, cols] and format of each tensor role."""
    d, f, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or d // nh
    shapes = {"embd": (V, d), "out": (V, d), "q": (nh * hd, d), "k": (nkv * hd, d), "v": (nkv * hd, d),
              "o": (d, nh * hd), "gate": (f, d), "up": (f, d), "down": (d, f)}
    types = {k: qtype for k in shapes}
    types.update(embd=embd_qtype, out=out_qtype)
    return shapes, types


def role_bytes(shapes, types):
    return {k: r * c // QT[types[k]][1] * QT[types[k]][2] for k, (r, c) in shapes.items()}


def add_synthetic_vocab(w, V):
    """A SentencePiece (`llama`) vocabulary of V pieces, so that llama.cpp loads the file too (it
    needs tokenizer.ggml.model): <unk>, <s>, </s>, the 256 byte pieces, then plain pieces t<id>.
    The benchmarks feed token ids, so the pieces' text never matters."""
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += [f"t{i}" for i in range(len(toks), V)]
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(V - 259)])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (V - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)


def write_gguf(path, cfg, shapes, types, seed=0):
    """A llama GGUF of random blocks shaped by an HF config.json dict."""
    import gguf
    d, f, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or d // nh
    rng = np.random.default_rng(seed)
    # One pool of random blocks per format, as large as its largest tensor; every tensor is a
    # view into it at some offset (identical bytes do not change the timing).
    need = {}
    for k, (r, c) in shapes.items():
        _, qk, bsz = QT[types[k]]
        need[types[k]] = max(need.get(types[k], 0), r * c // qk)
    pools = {q: block_pool(rng, q, n + 4096) for q, n in need.items()}

    def raw(role):
        r, c = shapes[role]
        _, qk, bsz = QT[types[role]]
        nb = r * c // qk
        pool = pools[types[role]]
        off = int(rng.integers(0, len(pool) // bsz - nb + 1)) * bsz
        return pool[off:off + nb * bsz].reshape(r, c // qk * bsz)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(L)
    w.add_context_length(cfg.get("max_position_embeddings", 8192))
    w.add_embedding_length(d)
    w.add_feed_forward_length(f)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-5))
    w.add_rope_freq_base(cfg.get("rope_theta", 500000.0))
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(V)
    add_synthetic_vocab(w, V)

    def mat(name, role):
        a = raw(role)
        w.add_tensor(name, a, raw_shape=a.shape, raw_dtype=gguf.GGMLQuantizationType(QT[types[role]][0]))

    norm = np.ones(d, np.float32)
    mat("token_embd.weight", "embd")
    w.add_tensor("output_norm.weight", norm)
    mat("output.weight", "out")
    names = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate",
             "up": "ffn_up", "down": "ffn_down"}
    for l in range(L):
        w.add_tensor(f"blk.{l}.attn_norm.weight", norm)
        w.add_tensor(f"blk.{l}.ffn_norm.weight", norm)
        for role, nm in names.items():
            mat(f"blk.{l}.{nm}.weight", role)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def bytes_per_token(cfg, rb, ctx):
    d, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or d // nh
    layer = sum(rb[k] for k in ("q", "k", "v", "o", "gate", "up", "down")) + 2 * d * 4
    weights = L * layer + rb["out"] + d * 4 + rb["embd"] // cfg["vocab_size"]
    kv = 2 * L * 2 * nkv * hd * ctx
    return weights, kv


def copy_bandwidth():
    try:
        sys.path.insert(0, str(REPO / "bench"))
        from gpu_decode import copy_bandwidth as cb
        return cb()
    except Exception as e:  # no torch: the anchor's figure
        print(f"(copy bandwidth not measured: {e}; using 4.30 TB/s)")
        return 4.30e12


def run_kaon(kaon, model, prompt_len, n_new, env_extra=None, device="cuda"):
    ids = ",".join(str(1000 + (i * 7919) % 30000) for i in range(prompt_len))
    cmd = [kaon, "run", "--device", device, "-m", str(model), "--prompt-ids", ids, "-n", str(n_new), "--temp", "0",
           "--ignore-eos", "--print-ids", "--ctx-size", str(prompt_len + n_new + 16)]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **(env_extra or {})), timeout=900)
    wall = time.time() - t0
    if p.returncode != 0:
        raise RuntimeError(f"kaon failed ({p.returncode}): {p.stderr[-2000:]}")
    from gpu_decode import run_figures
    return dict(run_figures(p.stderr), wall_s=wall, ids=json.loads(p.stdout.strip().splitlines()[-1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kaon", default=str(REPO / "build" / "kaon"))
    ap.add_argument("--config", default=str(REPO / "bench/configs/meta-llama__Llama-3.1-8B.json"))
    ap.add_argument("--qtype", default="Q4_0", choices=list(QT))
    ap.add_argument("--out-qtype", default="Q6_K", choices=list(QT))
    ap.add_argument("--embd-qtype", default=None, choices=list(QT), help="default: --qtype")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the config (quick runs)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--keep", default=None, help="write the GGUF here (and reuse it when it exists)")
    ap.add_argument("--variants", default="graphs",
                    help="comma list of: graphs, no-graphs, no-pdl, bf16 (KAON_CUDA_QUANT=0: weights expanded)")
    ap.add_argument("--bw", type=float, default=None, help="bandwidth for the roofline (bytes/s); default: measured")
    ap.add_argument("--json", default=None, help="append result lines here")
    a = ap.parse_args()
    cfg = json.loads(Path(a.config).read_text())
    if a.layers:
        cfg["num_hidden_layers"] = a.layers
    embd = a.embd_qtype or a.qtype
    tmpdir = None
    if a.keep:
        path = Path(a.keep)
    else:
        tmpdir = tempfile.TemporaryDirectory(prefix="kaon_gguf_")
        path = Path(tmpdir.name) / "model.gguf"
    t0 = time.time()
    exists = path.exists()
    shapes, types = roles(cfg, a.qtype, a.out_qtype, embd)
    rb = role_bytes(shapes, types)
    if not exists:
        write_gguf(path, cfg, shapes, types)
    print(f"GGUF {path} ({path.stat().st_size / 1e9:.2f} GB) {'reused' if exists else 'written'} in "
          f"{time.time() - t0:.1f} s")
    bw = a.bw or copy_bandwidth()
    envs = {"graphs": None, "no-graphs": {"KAON_CUDA_GRAPHS": "0"}, "no-pdl": {"KAON_PDL": "0"},
            "bf16": {"KAON_CUDA_QUANT": "0"}}
    rows = []
    for v in a.variants.split(","):
        r = run_kaon(a.kaon, path, a.prompt_len, a.tokens, envs[v])
        w, kv = bytes_per_token(cfg, rb, a.prompt_len + a.tokens / 2)
        if v == "bf16":  # the same weights expanded: 2 bytes per value
            L, d, f, V = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
            nh = cfg["num_attention_heads"]
            nkv = cfg.get("num_key_value_heads", nh)
            hd = cfg.get("head_dim") or d // nh
            w = 2 * (L * (2 * d * nh * hd + 2 * d * nkv * hd + 3 * d * f) + V * d + d) + L * 2 * d * 4 + d * 4
        roof = bw / (w + kv)
        rows.append(dict(kind="decode_gguf", variant=v, qtype=a.qtype, out_qtype=a.out_qtype, embd_qtype=embd,
                         layers=cfg["num_hidden_layers"], batch=1, prompt=a.prompt_len, tokens=r["generated"],
                         decode_tok_s=r["decode_tok_s"], ms_per_token=1e3 / r["decode_tok_s"],
                         bytes_per_token_GB=(w + kv) / 1e9, bandwidth_TBs=bw / 1e12, roofline_tok_s=roof,
                         roofline_fraction=r["decode_tok_s"] / roof,
                         vs_llama_cpp_q4_0_333=r["decode_tok_s"] / LLAMA_CPP_Q4_0_TG,
                         wall_s=r["wall_s"], host_us_per_step=r["host_us_per_step"], first_ids=r["ids"][:8]))
    for row in rows:
        print(json.dumps(row))
        if a.json:
            with open(a.json, "a") as fh:
                fh.write(json.dumps(dict(row, date=time.strftime("%Y-%m-%d %H:%M"))) + "\n")
    print(f"\nbandwidth {bw / 1e12:.3f} TB/s")
    for row in rows:
        print(f"decode {row['variant']:9s} {row['qtype']}/{row['out_qtype']}: {row['decode_tok_s']:7.1f} tok/s "
              f"{row['ms_per_token']:.3f} ms/token; roofline {row['roofline_tok_s']:.0f} tok/s "
              f"({row['bytes_per_token_GB']:.2f} GB/token): {row['roofline_fraction'] * 100:.1f}%; "
              f"{row['vs_llama_cpp_q4_0_333']:.2f}x llama.cpp's 333 tok/s (wall {row['wall_s']:.1f} s)"
              + (f"; host {row['host_us_per_step']:.1f} us/step" if row["host_us_per_step"] is not None else ""))
    if tmpdir:
        tmpdir.cleanup()


if __name__ == "__main__":
    main()
