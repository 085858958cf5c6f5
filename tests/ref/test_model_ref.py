"""kaon's forward pass against an independent numpy reference (refmodel.py): tiny random HF
checkpoints of each architecture (F32, BF16, and as GGUF), and the real SmolLM2 Q4_1 file read
through the `gguf` package's own dequantizers."""
import numpy as np
import pytest

from bf16 import round_bf16
from conftest import kaon_logits
from gguf_files import load_gguf_reference
from refmodel import RefModel
from tiny_models import make_config, make_weights, save_gguf, save_hf

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]
IDS = [1, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13, 8, 150, 77, 31]


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fmt,tol", [("F32", 1e-4), ("BF16", 1e-2), ("GGUF-F32", 1e-4)])
def test_tiny_checkpoint(kaon_bin, tmp_path, arch, fmt, tol):
    cfg = make_config(arch)
    w = make_weights(cfg, seed=ARCHS.index(arch))
    if fmt == "BF16":
        w = round_bf16(w)  # the reference sees exactly the stored bf16 values
    ref = RefModel(cfg, w).forward(IDS)
    if fmt.startswith("GGUF"):
        model = save_gguf(tmp_path / f"{arch}.gguf", cfg, w)
    else:
        model = save_hf(tmp_path / f"{arch}-{fmt}", cfg, w, fmt)
    ours = kaon_logits(kaon_bin, model, IDS, tmp_path)
    err = rel_err(ours, ref)
    print(f"{arch} {fmt}: relative logit error {err:.2e}")
    assert err < tol
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
    # The decode path (one token per step through the paged cache) gives the same logits.
    dec = kaon_logits(kaon_bin, model, IDS, tmp_path, decode=True)
    assert rel_err(dec, ref) < tol


# ---- the real SmolLM2 Q4_1 file ----------------------------------------------------------

PROMPTS = [
    "The capital of France is",
    "Once upon a time there was a little",
    "The best way to learn a new language is to",
    "Water boils at a temperature of",
]


def words_to_ids(text, tokens):
    """Prompt ids by whole-word vocabulary lookup (GPT-2 byte-level: 'Ġ' marks a space)."""
    index = {t: i for i, t in enumerate(tokens)}
    ids = [1]  # BOS (<|im_start|> is 1 in SmolLM2, as add_bos_token says)
    for k, word in enumerate(text.split(" ")):
        piece = word if k == 0 else "\u0120" + word
        assert piece in index, piece
        ids.append(index[piece])
    return ids


def test_smollm2_q4_1_greedy_against_gguf_dequantizers(kaon_bin, default_model, tmp_path):
    cfg, w, tokens = load_gguf_reference(default_model)
    cfg["vocab_size"] = w["model.embed_tokens.weight"].shape[0]
    ref = RefModel(cfg, w, dtype=np.float32)
    n_new = 64
    agree = total = 0
    errs, misses = [], []
    for text in PROMPTS:
        ids = words_to_ids(text, tokens)
        ref.reset()
        logits = [ref.forward(ids)[-1]]
        seq = list(ids)
        for _ in range(n_new - 1):
            seq.append(int(np.argmax(logits[-1])))
            logits.append(ref.forward([seq[-1]])[-1])
        seq.append(int(np.argmax(logits[-1])))
        ref_logits = np.stack(logits)  # [n_new, V]: at positions len(ids)-1 .. end-1
        ours = kaon_logits(kaon_bin, default_model, seq[:-1], tmp_path)[len(ids) - 1:]
        assert ours.shape == ref_logits.shape
        errs.append(rel_err(ours, ref_logits))
        for i in range(n_new):
            a, b = int(ours[i].argmax()), int(ref_logits[i].argmax())
            total += 1
            if a == b:
                agree += 1
            else:
                misses.append(float(ref_logits[i][b] - ref_logits[i][a]))
        print(f"{text!r}: greedy ref continuation {seq[len(ids):len(ids)+12]}... rel err {errs[-1]:.3e}")
    rate = agree / total
    print(f"SmolLM2 Q4_1: top-1 agreement {agree}/{total} = {rate:.4f}; relative logit error "
          f"mean {np.mean(errs):.3e} max {np.max(errs):.3e}; misses' reference margins {misses}")
    assert total == 256
    assert rate >= 0.98
    # Every miss is a near-tie in the reference's own logits.
    assert all(m < 0.5 for m in misses), misses
