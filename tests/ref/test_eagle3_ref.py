"""An EAGLE-3 head (speculative decoding, method "eagle3") against a numpy float64 reference
(eagle3_files.py) on a tiny random Llama target and a tiny random head: tests/tools/mtp_logits
runs the prompt through the target (keeping the hidden states entering the head's three
auxiliary layers), then the head over it as the engine does after a step (row p: token p + 1
at position p with fc of the target's states at p), then one chained step fed the head's own
output before its final norm (vLLM's hidden_prenorm)."""
import os
import subprocess

import numpy as np
import pytest

from conftest import build_dir
from eagle3_files import HeadRef, aux_layers, head_config, head_weights, save_head, target_with_aux
from logit_checks import assert_logits_match
from tiny_models import make_config, make_weights, save_hf

IDS = [2, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13, 8, 150, 77, 31, 270, 263]
NEXT = 101


def tiny_target(tmp_path, layers=6, dtype="F32"):
    cfg = dict(make_config("llama"), num_hidden_layers=layers)
    w = make_weights(cfg, seed=1)
    return save_hf(tmp_path / f"target-{dtype}", cfg, w, dtype), cfg, w


def run_tool(model, head, ids, nxt, tmp_path, V, Vd):
    exe = build_dir() / "tests" / "mtp_logits"
    t_out, d_out = tmp_path / "target.f32", tmp_path / "draft.f32"
    dev = os.environ.get("KAON_TEST_DEVICE") or "cpu"
    r = subprocess.run([str(exe), str(model), ",".join(map(str, ids)), str(nxt), str(t_out), str(d_out), dev,
                        str(head)], capture_output=True, text=True, timeout=300)
    return r, t_out, d_out


def kaon_eagle3(model, head, ids, nxt, tmp_path, V, Vd):
    r, t_out, d_out = run_tool(model, head, ids, nxt, tmp_path, V, Vd)
    assert r.returncode == 0, r.stderr
    return (np.fromfile(t_out, np.float32).reshape(len(ids), V).astype(np.float64),
            np.fromfile(d_out, np.float32).reshape(len(ids), Vd).astype(np.float64))


def reference(tcfg, tw, hcfg, hw, ids, nxt, prefix="midlayer."):
    target, aux = target_with_aux(tcfg, tw, ids, aux_layers(tcfg, hcfg))
    head = HeadRef(hcfg, hw, tw["model.embed_tokens.weight"], prefix)
    n = len(ids)
    g = aux[:-1] @ np.asarray(hw["fc.weight"], np.float64).T
    h1, d1 = head.step(ids[1:], g, np.arange(n - 1))
    _, d2 = head.step([nxt], h1[-1:], [n - 1])
    return target, np.concatenate([d1, d2])


@pytest.mark.parametrize("fmt,aux,own_embed,prefix,nbr", [
    ("F32", None, False, "midlayer.", False),      # default layers 2, N/2, N-3; the target's embedding
    ("F32", [0, 2, 4], True, "layers.0.", False),  # the config's layer ids; the head's own embedding
    ("F32", None, False, "midlayer.", True),       # norm_before_residual
    ("BF16", None, False, "midlayer.", False),
])
def test_eagle3_draft_logits(tmp_path, fmt, aux, own_embed, prefix, nbr):
    model, tcfg, tw = tiny_target(tmp_path, dtype=fmt)
    hcfg = head_config(tcfg, aux_ids=aux, arch="LlamaForCausalLMEagle3" if own_embed else "LlamaForCausalLM")
    if nbr:
        hcfg["norm_before_residual"] = True
    hw, d2t, t2d = head_weights(hcfg, own_embed=own_embed, prefix=prefix)
    head = save_head(str(tmp_path / "head"), hcfg, hw, d2t, t2d, fmt)
    if fmt == "BF16":  # the reference computes with the values the files hold
        from bf16 import round_bf16
        tw, hw = round_bf16(tw), round_bf16(hw)
    target, draft = reference(tcfg, tw, hcfg, hw, IDS, NEXT, prefix)
    ours_t, ours_d = kaon_eagle3(model, head, IDS, NEXT, tmp_path, tcfg["vocab_size"], hcfg["draft_vocab_size"])
    tol = 1e-4 if fmt == "F32" and not os.environ.get("KAON_TEST_DEVICE") else 2e-2
    assert_logits_match(ours_t, target, tol, f"llama {fmt} target")
    assert_logits_match(ours_d[:-1], draft[:-1], tol, f"EAGLE-3 {fmt} draft over the prompt")
    assert_logits_match(ours_d[-1:], draft[-1:], tol, f"EAGLE-3 {fmt} chained step")
    # The wiring matters: other auxiliary layers, or the normed output fed back, do not pass.
    other = dict(hcfg, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 1, 1]})
    _, wrong = reference(tcfg, tw, other, hw, IDS, NEXT, prefix)
    assert np.linalg.norm(wrong[:-1] - draft[:-1]) > 0.05 * np.linalg.norm(draft[:-1])


def test_eagle3_bad_heads(tmp_path):
    """A head that does not fit the target is refused with one clear error, never a crash."""
    model, tcfg, _ = tiny_target(tmp_path)
    cases = [
        (dict(head_config(tcfg), hidden_size=32), "hidden size"),
        (dict(head_config(tcfg), target_hidden_size=128), "hidden size"),
        (dict(head_config(tcfg), num_hidden_layers=2), "one-layer"),
        (dict(head_config(tcfg), architectures=["MixtralForCausalLM"]), "architectures"),
        (head_config(tcfg, aux_ids=[0, 1, 9]), "outside"),
    ]
    for i, (hcfg, words) in enumerate(cases):
        hw, d2t, t2d = head_weights(dict(head_config(tcfg), **{k: hcfg[k] for k in ("draft_vocab_size",)}))
        head = save_head(str(tmp_path / f"bad{i}"), hcfg, hw, d2t, t2d)
        r, _, _ = run_tool(model, head, [1, 2, 3], 4, tmp_path, 0, 0)
        assert r.returncode == 1 and words in r.stderr, (hcfg, r.stderr)
    r, _, _ = run_tool(model, tmp_path / "missing", [1, 2, 3], 4, tmp_path, 0, 0)
    assert r.returncode == 1 and "No such file" in r.stderr, r.stderr
    # a d2t that leaves the vocabulary
    hcfg = head_config(tcfg)
    hw, d2t, t2d = head_weights(hcfg)
    d2t[-1] = 10_000
    head = save_head(str(tmp_path / "bad-d2t"), hcfg, hw, d2t, t2d)
    r, _, _ = run_tool(model, head, [1, 2, 3], 4, tmp_path, 0, 0)
    assert r.returncode == 1 and "d2t" in r.stderr, r.stderr
