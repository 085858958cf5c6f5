"""Speculative decoding (n-gram drafts verified in one forward pass) through `kaon generate` on
the tiny checkpoints of test_engine.py: every request's output -- greedy, seeded sampling, with
penalties, logit bias, min_tokens, stop tokens -- is token for token the same
as without speculation, under batching, chunked prefill and preemption; and each run shows
that drafts were proposed, accepted and rejected (so the rollback ran).
KAON_TEST_DEVICE=cuda runs the same on the GPU (device sampling of the verify rows)."""
import json
import os
import random
import subprocess

import pytest

from test_engine import generate, ids, kv_bytes_per_token, tiny, tiny_llama  # noqa: F401 (fixtures)

DEV = ["--device", os.environ["KAON_TEST_DEVICE"]] if os.environ.get("KAON_TEST_DEVICE") else []
SPEC = DEV + ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 4,
                                            "prompt_lookup_min": 1, "disable_by_batch_size": -1})]


def loop_prompts(n=48, seed=0):
    """Prompts that repeat a short motif (so a suffix recurs and drafts get proposed), some
    with a random tail (so the model's continuation often departs from the drafts)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        motif = [rng.randrange(3, 300) for _ in range(rng.randrange(2, 7))]
        p = motif * rng.randrange(2, 6)
        if i % 3 == 0:
            p += [rng.randrange(3, 300) for _ in range(rng.randrange(1, 9))]
        out.append(p)
    return out


def check_spec_ran(st):
    assert st["spec_drafts"] > 0 and st["spec_accepted_tokens"] > 0, st
    assert st["spec_draft_tokens"] > st["spec_accepted_tokens"], st  # some were rejected


GREEDY = DEV + ["--temp", "0", "--max-tokens", "24", "--ignore-eos"]


@pytest.mark.parametrize("layout", ["alone", "batched", "chunked", "preempted"])
def test_greedy_same_with_drafts(kaon_bin, tiny, tmp_path, layout, monkeypatch):
    """Against a plain run of the same layout (on the CPU every layout gives the alone run's ids
    anyway: test_engine.py; on a GPU the plain runs' own batch dependence stays out of it)."""
    prompts = loop_prompts()
    if layout == "preempted":
        monkeypatch.setenv("KAON_ADMIT_RATIO", "0")  # admit by the prompt alone, so the pool runs dry
    extra = {"alone": ["--max-num-seqs", "1"],
             "batched": ["--max-num-seqs", "64", "--no-prefix-caching"],
             "chunked": ["--max-num-seqs", "8", "--max-num-batched-tokens", "13"],
             "preempted": ["--max-num-seqs", "64", "--kv-cache-memory",
                           str(40 * 16 * kv_bytes_per_token(kaon_bin, tiny) / 1048576)]}[layout]
    plain, st_plain = generate(kaon_bin, tiny, tmp_path, prompts, GREEDY + extra, name="plain")
    spec, st = generate(kaon_bin, tiny, tmp_path, prompts, GREEDY + extra + SPEC, name="spec")
    assert ids(spec) == ids(plain)
    check_spec_ran(st)
    if layout == "preempted":
        assert st["preemptions"] > 0, st
        assert st["kv_blocks_used"] == 0, st
    if layout == "alone":  # verifying drafts saves steps
        assert st["steps"] < st_plain["steps"], (st, st_plain)
    elif not DEV:  # on the CPU also the one-at-a-time output
        alone, _ = generate(kaon_bin, tiny, tmp_path, prompts, GREEDY + ["--max-num-seqs", "1"], name="alone")
        assert ids(spec) == ids(alone)


SAMPLED = [
    ("temperature", ["--temp", "1.0"], {}),
    ("top_p_top_k", ["--temp", "0.8", "--top-p", "0.9", "--top-k", "20"], {}),
    ("min_p", ["--temp", "0.6", "--min-p", "0.1"], {}),
    ("penalties", ["--temp", "0.7"], {"presence_penalty": 0.4, "frequency_penalty": 0.3, "repetition_penalty": 1.2}),
    ("greedy_penalties", ["--temp", "0"], {"frequency_penalty": 0.5}),
    ("logit_bias_min_tokens", ["--temp", "0.9"], {"logit_bias": {"7": 3.0, "11": -2.0}, "min_tokens": 6}),
    ("stop_ids", ["--temp", "1.0"], {"stop_token_ids": [5, 9, 13]}),
]


@pytest.mark.parametrize("name,flags,body", SAMPLED, ids=[c[0] for c in SAMPLED])
def test_sampling_same_with_drafts(kaon_bin, tiny_llama, tmp_path, name, flags, body):
    """Each position's token is drawn from the same distribution with the same random numbers
    as without drafts, so seeded outputs are identical (logprobs and n > 1: tests/e2e)."""
    prompts = loop_prompts(n=24, seed=3)
    per = lambda i: {**body, "seed": 100 + i}
    args = DEV + flags + ["--max-tokens", "20", "--max-num-seqs", "24"]
    plain, _ = generate(kaon_bin, tiny_llama, tmp_path, prompts, args, per, name="plain")
    spec, st = generate(kaon_bin, tiny_llama, tmp_path, prompts, args + SPEC, per, name="spec")
    assert spec == plain
    assert st["spec_drafts"] > 0, st
    if "penalties" not in name:  # a penalty pushes the output off the repeats drafts guess
        assert st["spec_accepted_tokens"] > 0, st


def test_max_tokens_and_context_bounds(kaon_bin, tiny_llama, tmp_path):
    """Drafts never run a sequence past max_tokens or the context: lengths are exact."""
    prompts = loop_prompts(n=16, seed=9)
    for mt in (1, 2, 3, 5):
        args = DEV + ["--temp", "0", "--max-tokens", str(mt), "--ignore-eos"]
        plain, _ = generate(kaon_bin, tiny_llama, tmp_path, prompts, args, name=f"p{mt}")
        spec, _ = generate(kaon_bin, tiny_llama, tmp_path, prompts, args + SPEC, name=f"s{mt}")
        assert ids(spec) == ids(plain)
        assert all(len(r["token_ids"]) == mt for r in spec)
    # Up to the context limit: every sequence ends on "length" at exactly max_model_len.
    args = DEV + ["--temp", "0", "--ignore-eos", "--max-model-len", "64"]
    plain, _ = generate(kaon_bin, tiny_llama, tmp_path, prompts, args, name="ctx-p")
    spec, st = generate(kaon_bin, tiny_llama, tmp_path, prompts, args + SPEC, name="ctx-s")
    assert ids(spec) == ids(plain)
    assert all(r["finish_reason"] == "length" and len(r["token_ids"]) + len(p) == 64
               for r, p in zip(spec, prompts))
    check_spec_ran(st)


@pytest.mark.parametrize("cfg,words", [
    ("{", "not a JSON object"),
    ('{"method": "eagle9", "num_speculative_tokens": 2}', "unknown method"),
    ('{"method": "ngram"}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 99}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3}', "prompt_lookup"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "bogus": 1}', "unknown key"),
    ('{"method": "ngram", "num_speculative_tokens": "2"}', "integer"),
    ('{"method": "mtp", "num_speculative_tokens": 2, "force_accept": 1}', "force_accept"),
    ('{"method": "mtp", "num_speculative_tokens": 2, "model": 3}', "model"),
    ('{"method": "eagle", "num_speculative_tokens": 2, "model": "/x"}', "EAGLE-1/2"),
    ('{"method": "eagle3", "num_speculative_tokens": 2}', "needs \"model\""),
])
def test_bad_speculative_config(kaon_bin, tiny_llama, tmp_path, cfg, words):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt_ids": [5, 6, 7]}) + "\n")
    for cmd in (["generate", "-m", str(tiny_llama), "--input", str(inp), "--output", str(tmp_path / "o.jsonl")],
                ["run", "-m", str(tiny_llama), "--prompt-ids", "5,6,7", "-n", "2"]):
        r = subprocess.run([str(kaon_bin), *cmd, "--speculative-config", cfg], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2, (cmd, cfg, r.stderr)
        assert words in r.stderr and r.stderr.count("\n") == 1, (cmd, r.stderr)


def chi2_crit(df, z=4.2649):
    """The chi-square statistic's 1 - 1e-5 quantile for df degrees of freedom (Wilson-Hilferty)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * a ** 0.5) ** 3


def test_sampled_distribution_real_model(kaon_bin, default_model, tmp_path):
    """The default model at temperature 1 on a prompt whose repeats draw drafts: the tokens at
    drafted positions are distributed as without speculation (independent seeds on each side:
    a chi-square test of homogeneity per position, bins of fewer than 10 expected pooled,
    passing at p >= 1e-5). Blindly kept drafts would pile mass on the repeat's next token."""
    text = "red green blue red green blue red green blue red green blue red green"
    r = subprocess.run([str(kaon_bin), "tokenize", "-m", str(default_model), "--text", text], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    prompt = json.loads(r.stdout)
    n = 1200
    # Blocks of 4 tokens: the prompt's first 12 are computed once and shared (prefix caching), so
    # the run's time goes to the drafted positions rather than to 1200 copies of one prompt.
    args = DEV + ["--temp", "0.7", "--max-tokens", "4", "--ignore-eos", "--max-num-seqs", "256", "--block-size", "4"]
    plain, _ = generate(kaon_bin, default_model, tmp_path, [prompt] * n, args, lambda i: {"seed": i},
                        name="dist-plain")
    spec, st = generate(kaon_bin, default_model, tmp_path, [prompt] * n, args + SPEC,
                        lambda i: {"seed": 100000 + i}, name="dist-spec")
    assert st["spec_drafts"] > n // 2 and st["spec_accepted_tokens"] > n // 4, st  # drafted positions
    assert st["prefix_hit_tokens"] > n * 8, st
    for pos in (1, 2, 3):  # position 0 is sampled from the prompt's own step
        a = [r["token_ids"][pos] for r in plain]
        b = [r["token_ids"][pos] for r in spec]
        keys = sorted(set(a) | set(b))
        ca = {k: a.count(k) for k in keys}
        cb = {k: b.count(k) for k in keys}
        bins, rest = [], [0, 0]
        for k in keys:  # equal sizes: a bin's expected count per side is (ca + cb) / 2
            if (ca[k] + cb[k]) / 2 >= 10:
                bins.append((ca[k], cb[k]))
            else:
                rest[0] += ca[k]
                rest[1] += cb[k]
        if sum(rest):
            bins.append(tuple(rest))
        assert len(bins) >= 2, (pos, bins)
        chi = sum((x - (x + y) / 2) ** 2 / ((x + y) / 2) + (y - (x + y) / 2) ** 2 / ((x + y) / 2) for x, y in bins)
        assert chi < chi2_crit(len(bins) - 1), (pos, chi, bins)


# ---- a draft model: DeepSeek's MTP layer (spec_model.c) --------------------------------------
# The tiny random DeepSeek-V3 of deepseek_models.py has an MTP layer (layer 4). With random
# weights its drafts rarely match the target's tokens; tiny_v3_echo's MTP layer is made to agree
# with the target where its output repeats, so drafts from the model pass the real verify.

def mtp_spec(k=3, **kw):
    return DEV + ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": k,
                                                      "disable_by_batch_size": -1, **kw})]


@pytest.fixture(scope="module")
def tiny_v3_mtp(tmp_path_factory):
    from deepseek_models import model_of
    path, _, cfg = model_of("v3", "F32", tmp_path_factory.mktemp("v3mtp"))
    assert cfg["num_nextn_predict_layers"] == 1
    return path


@pytest.fixture(scope="module")
def tiny_v3_echo(tmp_path_factory):
    """The tiny V3 whose MTP layer passes the target's hidden state through: eh_proj = [0 | I],
    hnorm and shared_head.norm = 1, o_proj and every expert's down_proj = 0 (the decoder layer
    adds nothing), shared_head.head = lm_head. So draft row p predicts the target's greedy token
    at p, i.e. t_{p+1} again: it drafts repeats of the last token, kept where the output loops."""
    import numpy as np
    from deepseek_models import make_config, make_weights, save_hf
    cfg = make_config("v3")
    w = make_weights(cfg, seed=11)
    d, p = cfg["hidden_size"], f"model.layers.{cfg['num_hidden_layers']}."
    w[p + "eh_proj.weight"] = np.concatenate([np.zeros((d, d)), np.eye(d)], 1).astype(np.float32)
    w[p + "hnorm.weight"] = w[p + "shared_head.norm.weight"] = np.ones(d, np.float32)
    for k in list(w):
        if k.startswith(p) and (k.endswith("o_proj.weight") or k.endswith("down_proj.weight")):
            w[k] = np.zeros_like(w[k])
    return save_hf(tmp_path_factory.mktemp("v3echo") / "v3-echo", cfg, w, "F32", "hub", False)


# f32 MLA cache: (kv_lora 40 + rope 32) x (4 layers + the MTP layer) x 4 bytes
V3_MTP_KV_BYTES = 72 * 5 * 4


def same_or_near_ties(exe, model, tmp_path, prompts, a, b, gap=0.02, min_same=0.75):
    """On the GPU everything runs in bf16 and a verify step (k + 1 rows a sequence, other GEMM
    tiles, other attention splits, other MoE routing ties) rounds differently from a decode step,
    so greedy outputs may part where the target's two candidates are nearly tied. Asserts that
    most outputs are equal and that every parting is such a tie: the CUDA logits of the prompt
    and the common prefix give both tokens within gap x the row's largest |logit|."""
    import numpy as np
    from conftest import kaon_logits
    parted = [(p, x, y) for p, x, y in zip(prompts, a, b) if x != y]
    assert len(parted) <= (1 - min_same) * len(a), f"{len(parted)} of {len(a)} outputs differ"
    for p, x, y in parted:
        i = next(j for j in range(min(len(x), len(y))) if x[j] != y[j])
        row = kaon_logits(exe, model, p + x[:i], tmp_path, extra=DEV)[-1]
        diff = abs(float(row[x[i]]) - float(row[y[i]]))
        print(f"parted at {i}: {x[i]} vs {y[i]}, logit gap {diff:.4g} of max {float(np.abs(row).max()):.4g}")
        assert diff <= gap * float(np.abs(row).max()), (i, x[i], y[i], diff, float(np.abs(row).max()))


@pytest.mark.parametrize("layout", ["alone", "batched", "chunked", "preempted", "prefix"])
def test_mtp_greedy_same(kaon_bin, tiny_v3_mtp, tmp_path, layout, monkeypatch):
    prompts = loop_prompts(n=24, seed=5)
    if layout == "preempted":
        monkeypatch.setenv("KAON_ADMIT_RATIO", "0")  # admit by the prompt alone, so the pool runs dry
    if layout == "prefix":  # shared prefixes of whole blocks: later prompts reuse the MTP layer's cache too
        prompts = [prompts[0] * 4 + p for p in prompts]
    extra = {"alone": ["--max-num-seqs", "1"],
             "batched": ["--max-num-seqs", "64", "--no-prefix-caching"],
             "chunked": ["--max-num-seqs", "8", "--max-num-batched-tokens", "13"],
             "preempted": ["--max-num-seqs", "64", "--kv-cache-memory", str(24 * 16 * V3_MTP_KV_BYTES / 1048576)],
             "prefix": ["--max-num-seqs", "4"]}[layout]
    plain, _ = generate(kaon_bin, tiny_v3_mtp, tmp_path, prompts, GREEDY + extra, name="plain")
    spec, st = generate(kaon_bin, tiny_v3_mtp, tmp_path, prompts, GREEDY + extra + mtp_spec(), name="spec")
    if DEV:  # bf16 on the GPU: a verify step's shape is not a decode step's (see same_or_near_ties)
        same_or_near_ties(kaon_bin, tiny_v3_mtp, tmp_path, prompts, ids(plain), ids(spec))
    else:
        assert ids(spec) == ids(plain)
    assert st["spec_drafts"] > 0 and st["spec_draft_tokens"] > st["spec_drafts"], st  # chained drafts
    if layout == "preempted":
        assert st["preemptions"] > 0 and st["kv_blocks_used"] == 0, st
    if layout == "prefix":
        assert st["prefix_hit_tokens"] > 0, st
    if not DEV:
        alone, _ = generate(kaon_bin, tiny_v3_mtp, tmp_path, prompts, GREEDY + ["--max-num-seqs", "1"], name="alone")
        assert ids(spec) == ids(alone)


@pytest.mark.parametrize("name,flags,body", [SAMPLED[0], SAMPLED[3]], ids=["temperature", "penalties"])
def test_mtp_sampling_same(kaon_bin, tiny_v3_mtp, tmp_path, name, flags, body):
    """Seeded sampling is identical with MTP drafts; at temperature 1 some drafts are kept."""
    prompts = loop_prompts(n=24, seed=3)
    per = lambda i: {**body, "seed": 100 + i}
    args = DEV + flags + ["--max-tokens", "20", "--max-num-seqs", "24"]
    plain, _ = generate(kaon_bin, tiny_v3_mtp, tmp_path, prompts, args, per, name="plain")
    spec, st = generate(kaon_bin, tiny_v3_mtp, tmp_path, prompts, args + mtp_spec(k=2), per, name="spec")
    assert spec == plain
    assert st["spec_drafts"] > 0, st


def echo_accepted(out, k, max_tokens=24):
    """Drafts the echo MTP layer gets kept in one greedy output: every verify step drafts the last
    token k times (bounded by max_tokens) and keeps the leading ones the output repeats."""
    i, kept = 1, 0  # out[0] comes from the prompt's step
    while i < len(out):
        kk = min(k, max_tokens - i - 1)
        a = 0
        while a < kk and out[i + a] == out[i - 1]:
            a += 1
        kept += a
        i += a + 1
    return kept


@pytest.mark.parametrize("layout", ["alone", "batched", "chunked"])
def test_mtp_drafts_accepted(kaon_bin, tiny_v3_echo, tmp_path, layout):
    """Drafts of the (echo) MTP layer pass the real verify where the output repeats, and are
    rejected elsewhere; the output is the plain run's. Where nothing bounds the drafts (not
    chunked), exactly as many are kept as the output's repeats allow: a draft made from the
    wrong hidden row or chained wrongly would not repeat the last token."""
    prompts = loop_prompts(n=24, seed=5)
    extra = {"alone": ["--max-num-seqs", "1"], "batched": ["--max-num-seqs", "64"],
             "chunked": ["--max-num-seqs", "8", "--max-num-batched-tokens", "13"]}[layout]
    plain, _ = generate(kaon_bin, tiny_v3_echo, tmp_path, prompts, GREEDY + extra, name="plain")
    spec, st = generate(kaon_bin, tiny_v3_echo, tmp_path, prompts, GREEDY + extra + mtp_spec(k=3), name="spec")
    assert ids(spec) == ids(plain)
    check_spec_ran(st)
    if layout != "chunked":
        assert st["spec_accepted_tokens"] == sum(echo_accepted(o, 3) for o in ids(plain)), st


def test_mtp_force_accept(kaon_bin, tiny_v3_mtp, tmp_path):
    """Benchmarks only: force_accept keeps every draft unverified (the draft model still runs), so
    a step appends k + 1 tokens; the output is then NOT the model's."""
    prompts = loop_prompts(n=8, seed=7)
    args = GREEDY + ["--max-num-seqs", "8"]
    plain, st0 = generate(kaon_bin, tiny_v3_mtp, tmp_path, prompts, args, name="plain")
    forced, st = generate(kaon_bin, tiny_v3_mtp, tmp_path, prompts, args + mtp_spec(k=3, force_accept=True), name="forced")
    assert st["spec_accepted_tokens"] == st["spec_draft_tokens"] > 0, st
    assert st["steps"] < st0["steps"] * 0.6, (st, st0)
    assert all(len(r["token_ids"]) == 24 for r in forced)
    assert ids(forced) != ids(plain)


def test_mtp_needs_mtp_layers(kaon_bin, tiny_llama, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt_ids": [5, 6, 7]}) + "\n")
    r = subprocess.run([str(kaon_bin), "generate", "-m", str(tiny_llama), "--input", str(inp), "--output",
                        str(tmp_path / "o.jsonl"), *mtp_spec()], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "num_nextn_predict_layers" in r.stderr, r.stderr


# ---- a draft model: an EAGLE-3 head (model/eagle3.c, spec_model.c) ---------------------------
# A tiny random 4-layer Llama and a tiny random head (eagle3_files.py): the head's drafts are
# mostly rejected, so these runs test that drafting and the verify leave the outputs alone.

@pytest.fixture(scope="module")
def tiny_eagle3(tmp_path_factory):
    """(target folder, head folder)."""
    from eagle3_files import head_config, head_weights, save_head
    from tiny_models import make_config, make_weights, save_hf
    d = tmp_path_factory.mktemp("eagle3")
    cfg = dict(make_config("llama"), num_hidden_layers=4)
    target = save_hf(d / "llama4", cfg, make_weights(cfg, seed=7), "F32")
    hcfg = head_config(cfg, aux_ids=[0, 1, 2])
    hw, d2t, t2d = head_weights(hcfg, seed=5)
    return target, save_head(str(d / "head"), hcfg, hw, d2t, t2d)


@pytest.fixture(scope="module")
def tiny_eagle3_echo(tmp_path_factory):
    """(target, head) where the head drafts t_{N-2} again and again: aux_ids -1 makes fc's first
    input the target's embedding of the row's position, fc = [I | 0 | 0], o_proj and down_proj = 0
    (the layer adds nothing), norm and hidden_norm = 1, lm_head = the embedding's rows in a random
    order that d2t undoes. So it is kept where the output loops with period 1 (or 2, the first
    draft), through the real verify, and only if the aux rows, the chain and d2t are right."""
    import numpy as np
    from eagle3_files import head_config, head_weights, save_head
    from tiny_models import make_config, make_weights, save_hf
    d = tmp_path_factory.mktemp("eagle3echo")
    cfg = dict(make_config("llama"), num_hidden_layers=4)
    tw = make_weights(cfg, seed=7)
    target = save_hf(d / "llama4", cfg, tw, "F32")
    V, dim = cfg["vocab_size"], cfg["hidden_size"]
    hcfg = head_config(cfg, draft_vocab=V, aux_ids=[-1, 0, 1])
    hw, _, t2d = head_weights(hcfg, seed=5)
    perm = np.random.default_rng(9).permutation(V)
    hw["fc.weight"] = np.concatenate([np.eye(dim), np.zeros((dim, 2 * dim))], 1).astype(np.float32)
    for n in ("norm.weight", "midlayer.hidden_norm.weight"):
        hw[n] = np.ones(dim, np.float32)
    for n in ("midlayer.self_attn.o_proj.weight", "midlayer.mlp.down_proj.weight"):
        hw[n] = np.zeros_like(hw[n])
    hw["lm_head.weight"] = tw["model.embed_tokens.weight"][perm]
    return target, save_head(str(d / "head"), hcfg, hw, (perm - np.arange(V)).astype(np.int64), t2d)


def echo2_accepted(prompt, out, k, max_tokens=24):
    """Drafts the echo head gets kept: each verify step of a sequence of N tokens drafts
    t_{N-2} k times (bounded by max_tokens) and keeps the leading ones the output repeats."""
    full, i, kept = prompt + out, 1, 0
    while i < len(out):
        n, kk, a = len(prompt) + i, min(k, max_tokens - i - 1), 0
        while a < kk and full[n + a] == full[n - 2]:
            a += 1
        kept += a
        i += a + 1
    return kept


@pytest.mark.parametrize("layout", ["alone", "batched", "chunked"])
def test_eagle3_drafts_accepted(kaon_bin, tiny_eagle3_echo, tmp_path, layout):
    target, head = tiny_eagle3_echo
    prompts = loop_prompts(n=24, seed=5)
    extra = {"alone": ["--max-num-seqs", "1"], "batched": ["--max-num-seqs", "64"],
             "chunked": ["--max-num-seqs", "8", "--max-num-batched-tokens", "13"]}[layout]
    plain, _ = generate(kaon_bin, target, tmp_path, prompts, GREEDY + extra, name="plain")
    spec, st = generate(kaon_bin, target, tmp_path, prompts, GREEDY + extra + eagle3_spec(head), name="spec")
    assert ids(spec) == ids(plain)
    check_spec_ran(st)
    if layout != "chunked":
        assert st["spec_accepted_tokens"] == sum(echo2_accepted(p, o, 3) for p, o in zip(prompts, ids(plain))), st


def eagle3_spec(head, k=3, **kw):
    return DEV + ["--speculative-config", json.dumps({"method": "eagle3", "model": str(head),
                                                      "num_speculative_tokens": k, "disable_by_batch_size": -1, **kw})]


# f32 KV: 2 x (2 KV heads x 16) x (4 layers + the head's) x 4 bytes
EAGLE3_KV_BYTES = 2 * 32 * 5 * 4


@pytest.mark.parametrize("layout", ["alone", "batched", "chunked", "preempted", "prefix"])
def test_eagle3_greedy_same(kaon_bin, tiny_eagle3, tmp_path, layout, monkeypatch):
    target, head = tiny_eagle3
    prompts = loop_prompts(n=24, seed=5)
    if layout == "preempted":
        monkeypatch.setenv("KAON_ADMIT_RATIO", "0")  # admit by the prompt alone, so the pool runs dry
    if layout == "prefix":
        prompts = [prompts[0] * 4 + p for p in prompts]
    extra = {"alone": ["--max-num-seqs", "1"],
             "batched": ["--max-num-seqs", "64", "--no-prefix-caching"],
             "chunked": ["--max-num-seqs", "8", "--max-num-batched-tokens", "13"],
             "preempted": ["--max-num-seqs", "64", "--kv-cache-memory", str(24 * 16 * EAGLE3_KV_BYTES / 1048576)],
             "prefix": ["--max-num-seqs", "4"]}[layout]
    plain, _ = generate(kaon_bin, target, tmp_path, prompts, GREEDY + extra, name="plain")
    spec, st = generate(kaon_bin, target, tmp_path, prompts, GREEDY + extra + eagle3_spec(head), name="spec")
    if DEV:
        same_or_near_ties(kaon_bin, target, tmp_path, prompts, ids(plain), ids(spec))
    else:
        assert ids(spec) == ids(plain)
    assert st["spec_drafts"] > 0 and st["spec_draft_tokens"] > st["spec_drafts"], st  # chained drafts
    if layout == "preempted":
        assert st["preemptions"] > 0 and st["kv_blocks_used"] == 0, st
    if layout == "prefix":
        assert st["prefix_hit_tokens"] > 0, st


@pytest.mark.parametrize("name,flags,body", [SAMPLED[0], SAMPLED[3]], ids=["temperature", "penalties"])
def test_eagle3_sampling_same(kaon_bin, tiny_eagle3, tmp_path, name, flags, body):
    target, head = tiny_eagle3
    prompts = loop_prompts(n=24, seed=3)
    per = lambda i: {**body, "seed": 100 + i}
    args = DEV + flags + ["--max-tokens", "20", "--max-num-seqs", "24"]
    plain, _ = generate(kaon_bin, target, tmp_path, prompts, args, per, name="plain")
    spec, st = generate(kaon_bin, target, tmp_path, prompts, args + eagle3_spec(head, k=2), per, name="spec")
    assert spec == plain
    assert st["spec_drafts"] > 0, st


def test_eagle3_force_accept(kaon_bin, tiny_eagle3, tmp_path):
    """force_accept (benchmarks): every draft of the head is kept, k + 1 tokens a step."""
    target, head = tiny_eagle3
    prompts = loop_prompts(n=8, seed=7)
    args = GREEDY + ["--max-num-seqs", "8"]
    plain, st0 = generate(kaon_bin, target, tmp_path, prompts, args, name="plain")
    forced, st = generate(kaon_bin, target, tmp_path, prompts, args + eagle3_spec(head, force_accept=True), name="forced")
    assert st["spec_accepted_tokens"] == st["spec_draft_tokens"] > 0, st
    assert st["steps"] < st0["steps"] * 0.6, (st, st0)
    assert all(len(r["token_ids"]) == 24 for r in forced)


def test_eagle3_dummy(kaon_bin, tiny_eagle3, tmp_path):
    """--load-format dummy: random target and head weights from the configs alone (benchmarks)."""
    target, head = tiny_eagle3
    forced, st = generate(kaon_bin, target, tmp_path, loop_prompts(n=4, seed=2),
                          GREEDY + ["--load-format", "dummy"] + eagle3_spec(head, force_accept=True), name="dummy")
    assert st["spec_accepted_tokens"] == st["spec_draft_tokens"] > 0, st


@pytest.mark.parametrize("cfg,words", [
    ('{"method": "eagle3", "num_speculative_tokens": 2, "model": "/nonexistent/head"}', "No such file"),
])
def test_eagle3_bad_config(kaon_bin, tiny_eagle3, tmp_path, cfg, words):
    target, _ = tiny_eagle3
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt_ids": [5, 6, 7]}) + "\n")
    for sub in (["generate", "-m", str(target), "--input", str(inp), "--output", str(tmp_path / "o.jsonl")],
                ["run", "-m", str(target), "--prompt-ids", "5,6,7", "-n", "2"]):
        r = subprocess.run([str(kaon_bin), *sub, "--speculative-config", cfg], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (sub, cfg, r.stderr)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        assert len(lines) == 1 and words in lines[0], r.stderr


def test_eagle3_needs_llama_target(kaon_bin, tiny_eagle3, tiny_v3_mtp, tmp_path):
    _, head = tiny_eagle3
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt_ids": [5, 6, 7]}) + "\n")
    r = subprocess.run([str(kaon_bin), "generate", "-m", str(tiny_v3_mtp), "--input", str(inp), "--output",
                        str(tmp_path / "o.jsonl"), *eagle3_spec(head)], capture_output=True, text=True, timeout=60)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Llama-family" in lines[0], r.stderr
