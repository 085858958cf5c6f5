"""Mixture-of-experts models (Mixtral, Qwen3-MoE with a dense layer, Qwen2-MoE with a shared
expert and MoE every second layer) on the CPU against the float64 numpy reference of
moe_models.py: tiny random HF folders (per-expert and transformers 5's fused layouts, F32 and
BF16) and GGUF files (stacked experts, F32 and Q8_0); prefill, one token per step (decode),
several sequences batched by the engine, and the expert load `kaon info --expert-load`
reports."""
import json
import re
import subprocess

import numpy as np
import pytest

from bf16 import round_bf16
from conftest import kaon_logits
from moe_models import (RefMoeModel, fuse_experts, is_moe_layer, make_moe_config, make_moe_weights,
                        save_moe_gguf)
from tiny_models import save_hf

ARCHS = ["mixtral", "qwen3moe", "qwen2moe"]
IDS = [1, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13, 8, 150, 77, 31]


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def model_of(arch, fmt, tmp_path):
    """(path, reference model) of one tiny checkpoint in one format."""
    cfg = make_moe_config(arch)
    w = make_moe_weights(cfg, seed=ARCHS.index(arch))
    if fmt == "BF16":
        w = round_bf16(w)
    if fmt.startswith("GGUF"):
        path = tmp_path / f"{arch}-{fmt}.gguf"
        qtype = None
        if fmt == "GGUF-Q8_0":
            from gguf import GGMLQuantizationType as QT
            qtype = QT.Q8_0
        w = save_moe_gguf(path, cfg, w, qtype)
    elif fmt == "HF-fused":
        path = save_hf(tmp_path / f"{arch}-{fmt}", cfg, fuse_experts(cfg, w), "F32")
    else:
        path = save_hf(tmp_path / f"{arch}-{fmt}", cfg, w, fmt)
    return path, RefMoeModel(cfg, w), cfg


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fmt,tol", [("F32", 1e-4), ("HF-fused", 1e-4), ("GGUF-F32", 1e-4), ("BF16", 1e-4)])
def test_tiny_moe_checkpoint(kaon_bin, tmp_path, arch, fmt, tol):
    model, ref_model, cfg = model_of(arch, fmt, tmp_path)
    ref = ref_model.forward(IDS)
    # The reference's routing has no near-ties, so float32 cannot choose other experts.
    assert ref_model.min_margin > 1e-4, ref_model.min_margin
    ours = kaon_logits(kaon_bin, model, IDS, tmp_path)
    err = rel_err(ours, ref)
    print(f"{arch} {fmt}: relative logit error {err:.2e} (routing margin {ref_model.min_margin:.2e})")
    assert err < tol
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
    # One token per step (the decode path) and prefill in chunks of 7 give the same logits.
    dec = kaon_logits(kaon_bin, model, IDS, tmp_path, decode=True)
    assert rel_err(dec, ref) < tol
    assert (dec.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_moe_q8_0(kaon_bin, tmp_path, arch):
    """Q8_0 matrices (routers F32, as llama.cpp quantizes): the reference uses the file's own
    dequantized weights, so what differs is kaon's 8-bit activations (<= 1/254 of a block's
    largest value per element)."""
    model, ref_model, cfg = model_of(arch, "GGUF-Q8_0", tmp_path)
    ref = ref_model.forward(IDS)
    ours = kaon_logits(kaon_bin, model, IDS, tmp_path)
    err = rel_err(ours, ref)
    srt = np.sort(ref, -1)
    agree = ours.argmax(-1) == ref.argmax(-1)
    print(f"{arch} Q8_0: relative logit error {err:.2e}, greedy {agree.sum()}/{len(agree)}, "
          f"routing margin {ref_model.min_margin:.2e}")
    assert err < 2e-2
    # Greedy choices agree except at near-ties of the reference.
    assert all(agree[i] or srt[i, -1] - srt[i, -2] < 0.05 for i in range(len(IDS)))
    dec = kaon_logits(kaon_bin, model, IDS, tmp_path, decode=True)
    assert rel_err(dec, ref) < 2e-2


@pytest.mark.parametrize("arch", ARCHS)
def test_expert_load_matches_reference(kaon_bin, tmp_path, arch):
    """`kaon info --expert-load --json`: the tokens each MoE layer routed to each expert equal
    the reference's routing, for the prompt and 4 greedy tokens after it."""
    model, ref_model, cfg = model_of(arch, "GGUF-F32", tmp_path)
    ids = IDS[:12]
    seq, logits = list(ids), ref_model.forward(ids)
    for _ in range(3):  # the 4th token is generated but not fed
        seq.append(int(logits[-1].argmax()))
        logits = ref_model.forward(seq[-1:])
    r = subprocess.run([str(kaon_bin), "info", str(model), "--expert-load", "--json", "-n", "4",
                        "--prompt-ids", ",".join(map(str, ids)), "--threads", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["tokens"] == 15 and got["top_k"] == cfg["num_experts_per_tok"]
    moe_layers = [l for l in range(cfg["num_hidden_layers"]) if is_moe_layer(cfg, l)]
    assert [x["layer"] for x in got["layers"]] == moe_layers
    for x in got["layers"]:
        assert x["counts"] == ref_model.counts[x["layer"]].tolist(), x
    # The human-readable table names every MoE layer.
    r = subprocess.run([str(kaon_bin), "info", str(model), "--expert-load", "--prompt-ids",
                        ",".join(map(str, ids))], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "experts:" in r.stdout and "expert load:" in r.stdout
    assert re.findall(r"layer +(\d+): imbalance", r.stdout) == [str(l) for l in moe_layers]


def test_info_on_dense_model_rejects_expert_load(kaon_bin, tmp_path):
    from tiny_models import make_config, make_weights
    cfg = make_config("llama")
    path = save_hf(tmp_path / "dense", cfg, make_weights(cfg), "F32")
    r = subprocess.run([str(kaon_bin), "info", str(path), "--expert-load", "--prompt-ids", "1,2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no experts" in r.stderr


def greedy_reference(ref_model, prompt, n):
    ref_model.reset()
    seq, logits = list(prompt), ref_model.forward(prompt)
    out = []
    for i in range(n):
        out.append(int(logits[-1].argmax()))
        if i + 1 < n:
            logits = ref_model.forward(out[-1:])
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_sequences_greedy(kaon_bin, tmp_path, arch):
    """Many sequences through the engine (`kaon generate`): chunked prefills and decodes of
    different sequences share steps, so experts see tokens of several sequences at once; each
    sequence's greedy continuation equals the reference's, run alone."""
    model, ref_model, cfg = model_of(arch, "F32", tmp_path)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, 300, int(rng.integers(3, 30))).tolist() for _ in range(8)]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
    r = subprocess.run([str(kaon_bin), "generate", "-m", str(model), "--input", str(inp), "--output",
                        str(out), "--threads", "2", "--quiet", "--temp", "0", "--max-tokens", "6",
                        "--ignore-eos", "--max-num-seqs", "8", "--max-num-batched-tokens", "24",
                        "--no-prefix-caching", "--expert-stats"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stderr.split("kaon-stats: ", 1)[1].splitlines()[0])
    load = json.loads(r.stderr.split("kaon-expert-load: ", 1)[1].splitlines()[0])
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert stats["steps"] < sum(len(p) for p in prompts) // 2  # really batched
    ref_model.counts[:] = 0
    for p, row in zip(prompts, rows):
        assert row["token_ids"] == greedy_reference(ref_model, p, 6), (p, row)
    # The engine's expert load (--expert-stats) is the reference's routing of the same tokens.
    assert load["n_layers"] == cfg["num_hidden_layers"]
    assert load["counts"] == ref_model.counts.tolist()


def byte_tokenizer(folder):
    """A byte-level BPE tokenizer.json with no merges: ids 3..258 are the 256 bytes (fits the
    tiny models' vocabulary of 300), so `kaon serve` can run them."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, extra = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    byte_char = dict(zip(bs, map(chr, cs)))
    specials = [("<s>", 0), ("<|endoftext|>", 1), ("</s>", 2)]
    vocab = {c: i for c, i in specials}
    vocab.update({byte_char[b]: 3 + b for b in range(256)})
    tok = {"version": "1.0", "normalizer": None, "post_processor": None,
           "added_tokens": [{"id": i, "content": c, "special": True, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False} for c, i in specials],
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []}}
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                              "add_bos_token": False}))


def test_server_expert_metrics(kaon_bin, tmp_path):
    """`kaon serve --expert-stats`: /metrics has kaon:moe_expert_tokens_total per MoE layer and
    expert; each layer's series add up to the tokens computed times top-k."""
    import time
    import urllib.request
    model, _, cfg = model_of("qwen2moe", "F32", tmp_path)
    byte_tokenizer(model)
    port_file = tmp_path / "port"
    proc = subprocess.Popen([str(kaon_bin), "serve", str(model), "--port", "0", "--port-file", str(port_file),
                             "--threads", "2", "--expert-stats", "--no-prefix-caching"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()
            time.sleep(0.05)
        host, port = port_file.read_text().split()
        base = f"http://{host}:{port}"
        while True:
            try:
                if urllib.request.urlopen(base + "/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()
            time.sleep(0.05)
        body = json.dumps({"prompt": "experts, route these bytes", "max_tokens": 5, "temperature": 0,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
        usage = json.loads(urllib.request.urlopen(req, timeout=60).read())["usage"]
        metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    rows = re.findall(r'kaon:moe_expert_tokens_total\{model_name="[^"]*",layer="(\d+)",expert="(\d+)"\} (\d+)', metrics)
    per_layer = {}
    for l, e, v in rows:
        per_layer[int(l)] = per_layer.get(int(l), 0) + int(v)
    assert sorted(per_layer) == [l for l in range(cfg["num_hidden_layers"]) if is_moe_layer(cfg, l)]
    computed = usage["prompt_tokens"] + usage["completion_tokens"] - 1  # the last token is not fed
    assert all(v == computed * cfg["num_experts_per_tok"] for v in per_layer.values()), (per_layer, usage)
    assert len(rows) == len(per_layer) * cfg["num_experts"]


@pytest.mark.parametrize("change,words", [
    ({"mlp_only_layers": "0"}, "mlp_only_layers"),
    ({"mlp_only_layers": [0, -1]}, "mlp_only_layers"),
    ({"num_experts_per_tok": 17}, "n_experts_used"),
    ({"num_experts": -1}, "n_experts"),
])
def test_bad_moe_config(kaon_bin, tmp_path, change, words):
    """A MoE config.json with a bad expert field fails to load with one error line naming it."""
    cfg = make_moe_config("qwen3moe")
    path = save_hf(tmp_path / "bad", cfg, make_moe_weights(cfg), "F32")
    (path / "config.json").write_text(json.dumps(dict(cfg, **change)))
    r = subprocess.run([str(kaon_bin), "info", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_missing_expert_tensor(kaon_bin, tmp_path):
    cfg = make_moe_config("mixtral")
    w = make_moe_weights(cfg)
    del w["model.layers.1.block_sparse_moe.experts.5.w3.weight"]
    path = save_hf(tmp_path / "missing", cfg, w, "F32")
    r = subprocess.run([str(kaon_bin), "info", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "experts.5.w3.weight" in r.stderr, r.stderr
