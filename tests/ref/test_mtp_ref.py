"""DeepSeek's MTP draft model (speculative decoding, method "mtp") against a numpy float64
reference on the tiny random DeepSeek-V3 of deepseek_models.py (its layer 4 is the MTP layer):
tests/tools/mtp_logits runs the prompt through the target, then the MTP layer over it as the
engine does after a step (row p: token p + 1 at position p with the target's final normed hidden
state h_p), then one chained draft step fed the draft's own normed output.

The MTP step (vLLM DeepSeekMultiTokenPredictorLayer, FORMATS-2 §8): e = embed(t_{p+1}), zeroed
at position 0; x = eh_proj([enorm(e) | hnorm(h_p)]); one decoder layer (MLA + MoE, residual);
logits = shared_head.head(shared_head.norm(x)). Chained steps use shared_head.norm(x) as the
next h (kaon's choice: the normed vector, as the target's h_p is; vLLM feeds the pre-norm x)."""
import os
import subprocess

import numpy as np
import pytest

from conftest import build_dir
from deepseek_models import make_config, model_of
from deepseek_ref import DeepseekRef
from logit_checks import assert_logits_match
from np_ops import rmsnorm

IDS = [2, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13, 8, 150, 77, 31, 270, 263]
NEXT = 101


def mtp_reference(cfg, w, ids, nxt):
    """(target logits [n, V], draft logits [n, V]: n - 1 rows over the prompt, then the chained one)."""
    ref = DeepseekRef(cfg, w)
    W, L, eps = ref.w, ref.L, ref.eps
    ref.C.append(np.zeros((0, ref.kvr)))  # the MTP layer's latent cache
    ref.KPE.append(np.zeros((0, ref.rd)))
    n = len(ids)
    pos = np.arange(n)
    x = W["model.embed_tokens.weight"][np.asarray(ids)]
    for l in range(L):
        p = f"model.layers.{l}."
        x = x + ref.attention(l, rmsnorm(x, W[p + "input_layernorm.weight"], eps), pos)
        x = x + ref.mlp(l, rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps))
    h = rmsnorm(x, W["model.norm.weight"], eps)
    target = h @ W["lm_head.weight"].T
    p = f"model.layers.{L}."

    def step(toks, hid, ps):
        e = W["model.embed_tokens.weight"][np.asarray(toks)].copy()
        e[ps == 0] = 0.0
        y = np.concatenate([rmsnorm(e, W[p + "enorm.weight"], eps), rmsnorm(hid, W[p + "hnorm.weight"], eps)], -1)
        y = y @ W[p + "eh_proj.weight"].T
        y = y + ref.attention(L, rmsnorm(y, W[p + "input_layernorm.weight"], eps), ps)
        y = y + ref.mlp(L, rmsnorm(y, W[p + "post_attention_layernorm.weight"], eps))
        hn = rmsnorm(y, W[p + "shared_head.norm.weight"], eps)
        return hn, hn @ W[p + "shared_head.head.weight"].T

    hd, d1 = step(ids[1:], h[:-1], pos[:-1])
    _, d2 = step([nxt], hd[-1:], np.array([n - 1]))
    return target, np.concatenate([d1, d2])


def kaon_mtp(model, ids, nxt, tmp_path, V):
    exe = build_dir() / "tests" / "mtp_logits"
    t_out, d_out = tmp_path / "target.f32", tmp_path / "draft.f32"
    dev = [os.environ["KAON_TEST_DEVICE"]] if os.environ.get("KAON_TEST_DEVICE") else []
    r = subprocess.run([str(exe), str(model), ",".join(map(str, ids)), str(nxt), str(t_out), str(d_out), *dev],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return (np.fromfile(t_out, np.float32).reshape(len(ids), V).astype(np.float64),
            np.fromfile(d_out, np.float32).reshape(len(ids), V).astype(np.float64))


@pytest.mark.parametrize("fmt", ["F32", "BF16"])
def test_mtp_draft_logits(tmp_path, fmt):
    cfg = make_config("v3")
    assert cfg["num_nextn_predict_layers"] == 1
    model, w, _ = model_of("v3", fmt, tmp_path)
    target, draft = mtp_reference(cfg, w, IDS, NEXT)
    ours_t, ours_d = kaon_mtp(model, IDS, NEXT, tmp_path, cfg["vocab_size"])
    tol = 1e-4 if fmt == "F32" and not os.environ.get("KAON_TEST_DEVICE") else 2e-2
    assert_logits_match(ours_t, target, tol, f"v3 {fmt} target")
    assert_logits_match(ours_d[:-1], draft[:-1], tol, f"v3 {fmt} MTP draft over the prompt")
    assert_logits_match(ours_d[-1:], draft[-1:], tol, f"v3 {fmt} MTP chained step")
    # The draft is not the target: a wrong wiring (e.g. the main head, no eh_proj) would not pass.
    assert np.linalg.norm(draft[:-1] - target[1:]) > 0.1 * np.linalg.norm(target[1:])


def test_mtp_needs_the_layer(tmp_path):
    """A checkpoint without MTP layers is refused with a clear error."""
    cfg = make_config("v2")
    model, _, _ = model_of("v2", "F32", tmp_path)
    exe = build_dir() / "tests" / "mtp_logits"
    r = subprocess.run([str(exe), str(model), "1,2,3", "4", str(tmp_path / "a"), str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "num_nextn_predict_layers" in r.stderr, r.stderr
    assert cfg.get("num_nextn_predict_layers", 0) == 0
