"""kaon's tokenizers against Hugging Face `tokenizers` (PyPI): 100% id equality on the corpus of
tests/ref/tokenizer_corpus.py (>= 2,000 strings), decode equality, and the incremental
detokenizer's output equal to the one-shot decode.

The C side is driven through `$KAON_BUILD/tests/test_tokenizer --encode-file TOK CORPUS`.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import tokenizer_corpus as tc  # noqa: E402

FIX = REPO / "tests" / "fixtures" / "tokenizers"
SMOLLM2 = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _exe():
    build = Path(os.environ.get("KAON_BUILD", REPO / "build"))
    exe = build / "tests" / "test_tokenizer"
    if not exe.exists():
        pytest.fail(f"{exe} not found: build kaon first (or set KAON_BUILD to your build folder)")
    return exe


def _hf(name):
    from tokenizers import Tokenizer
    if name == "smollm2_gguf":
        if not SMOLLM2.exists():
            pytest.fail(f"default model missing at {SMOLLM2}")
        return tc.smollm2_reference(SMOLLM2)
    json_name = {"llama3": "llama3", "qwen2": "qwen2", "spm_json": "spm", "spm_gguf": "spm",
                 "spm_metaspace": "spm_metaspace"}[name]
    return Tokenizer.from_file(str(FIX / json_name / "tokenizer.json"))


# What kaon loads for each case: the GGUF file, or the folder (tokenizer.json + config).
KAON_SOURCE = {
    "smollm2_gguf": SMOLLM2,
    "llama3": FIX / "llama3",
    "qwen2": FIX / "qwen2",
    "spm_json": FIX / "spm",
    "spm_gguf": FIX / "spm" / "tokenizer.gguf",
    "spm_metaspace": FIX / "spm_metaspace",
}

CORPUS = tc.make_corpus()


def _run_kaon(source, texts, tmp_path, add_special=False):
    corpus = tmp_path / f"corpus-{add_special}.jsonl"
    with open(corpus, "w") as f:
        for s in texts:
            f.write(json.dumps({"hex": s.encode("utf-8").hex()}) + "\n")
    cmd = [str(_exe()), "--encode-file", str(source), str(corpus)] + (["--add-special"] if add_special else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)} failed: {r.stderr}"
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == len(texts)
    return rows


def _dec(h):
    return bytes.fromhex(h).decode("utf-8")  # must be valid UTF-8


@pytest.mark.parametrize("name", list(KAON_SOURCE))
def test_against_hf(name, tmp_path):
    assert len(CORPUS) >= 2000
    hf = _hf(name)
    rows = _run_kaon(KAON_SOURCE[name], CORPUS, tmp_path)
    id_bad, dec_bad, inc_bad, roundtrip_ok, roundtrip_hf = [], [], [], 0, 0
    for s, row in zip(CORPUS, rows):
        want = hf.encode(s, add_special_tokens=False).ids
        if row["ids"] != want:
            id_bad.append((s, row["ids"], want))
            continue
        for key, skip in (("dec", False), ("dec_skip", True)):
            if _dec(row[key]) != hf.decode(want, skip_special_tokens=skip):
                dec_bad.append((s, key, _dec(row[key]), hf.decode(want, skip_special_tokens=skip)))
        if row["inc"] != row["dec"] or row["inc_skip"] != row["dec_skip"] or not row["inc_utf8"]:
            inc_bad.append(s)
        if hf.decode(want, skip_special_tokens=False) == s:
            roundtrip_hf += 1
            roundtrip_ok += _dec(row["dec"]) == s
    n = len(CORPUS)
    print(f"{name}: {n - len(id_bad)}/{n} id-equal, decode-equal {n - len(id_bad) - len(dec_bad)}, "
          f"roundtrip {roundtrip_ok}/{roundtrip_hf} where HF round-trips")
    assert not id_bad, f"{len(id_bad)} of {n} differ, e.g.:\n" + "\n".join(
        f"  {s!r}\n    kaon {k}\n    hf   {w}" for s, k, w in id_bad[:8])
    assert not dec_bad, f"{len(dec_bad)} decodes differ, e.g. {dec_bad[:5]!r}"
    assert not inc_bad, f"incremental decode differs from one-shot for {len(inc_bad)}, e.g. {inc_bad[:5]!r}"
    assert roundtrip_ok == roundtrip_hf
    assert roundtrip_hf > n // 2  # the corpus mostly round-trips (a sanity check on the check)


@pytest.mark.parametrize("name", list(KAON_SOURCE))
def test_add_special_against_hf(name, tmp_path):
    hf = _hf(name)
    texts = CORPUS[::7]
    rows = _run_kaon(KAON_SOURCE[name], texts, tmp_path, add_special=True)
    bad = [(s, r["ids"], hf.encode(s, add_special_tokens=True).ids) for s, r in zip(texts, rows)
           if r["ids"] != hf.encode(s, add_special_tokens=True).ids]
    assert not bad, f"{len(bad)} differ with add_special, e.g. {bad[:3]!r}"


def test_invalid_utf8_does_not_crash(tmp_path):
    """Invalid bytes: no crash, every byte that has a token is encoded through it (so the raw
    bytes of the token texts give back the input), and decode replaces each maximal invalid
    subsequence with U+FFFD like Python's errors="replace"."""
    import random
    rng = random.Random(7)
    blobs = [bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))) for _ in range(300)]
    blobs += [b"\x80", b"\xc3", b"\xe4\xb8", b"\xf0\x9f\x98", b"a\xedb", b"\xed\xa0\x80", b"\xc0\xaf"]
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text("".join(json.dumps({"hex": b.hex()}) + "\n" for b in blobs))
    for name in ("llama3", "spm_gguf", "spm_json"):
        r = subprocess.run([str(_exe()), "--encode-file", str(KAON_SOURCE[name]), str(corpus)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        rows = [json.loads(line) for line in r.stdout.splitlines()]
        assert len(rows) == len(blobs)
        for b, row in zip(blobs, rows):
            dec = bytes.fromhex(row["dec"])
            expect = b.decode("utf-8", errors="replace").encode()
            if name.startswith("spm"):
                # The SentencePiece decoder strips the prefix space; the input had none.
                expect = (b" " + b).decode("utf-8", errors="replace").encode()[1:]
            assert dec == expect, (name, b, dec, expect)
            assert row["inc"] == row["dec"] and row["inc_utf8"]


# GGUF byte-level vocabularies name their pre-tokenizer with tokenizer.ggml.pre. Build GGUF
# files from the qwen2 fixture's vocab and merges for each family, and the HF tokenizer with
# that family's real pre-tokenizer, and compare on the corpus.
DSV3_SPLITS = [r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
               r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]


def _family_pretok(pre):
    from tokenizers import Regex, pre_tokenizers as pt
    bl = pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)
    if pre == "gpt2":
        return pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre == "smollm":
        return pt.Sequence([pt.Digits(individual_digits=True),
                            pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    if pre == "llama-bpe":
        return pt.Sequence([pt.Split(Regex(tc.LLAMA3_PATTERN), behavior="isolated"), bl])
    if pre == "qwen2":
        return pt.Sequence([pt.Split(Regex(tc.QWEN2_PATTERN), behavior="isolated"), bl])
    if pre == "deepseek-v3":
        return pt.Sequence([pt.Split(Regex(p), behavior="isolated") for p in DSV3_SPLITS] + [bl])
    raise ValueError(pre)


@pytest.mark.parametrize("pre", ["gpt2", "smollm", "llama-bpe", "qwen2", "deepseek-v3"])
def test_gguf_pre_families(pre, tmp_path):
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models
    j = json.loads((FIX / "qwen2" / "tokenizer.json").read_text())
    vocab = dict(j["model"]["vocab"])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in j["model"]["merges"]]
    added = {a["id"]: a for a in j["added_tokens"]}
    for i, a in added.items():
        vocab[a["content"]] = i
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert len(tokens) == max(vocab.values()) + 1
    types = [(3 if added[i]["special"] else 4) if i in added else 1 for i in range(len(tokens))]
    path = tmp_path / f"{pre}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    model_vocab = dict(j["model"]["vocab"])  # the trainer put the specials in it; not the later added ones
    hf = Tokenizer(models.BPE(vocab=model_vocab, merges=merges, ignore_merges=pre == "llama-bpe"))
    hf.pre_tokenizer = _family_pretok(pre)
    hf.decoder = decoders.ByteLevel()
    hf.add_tokens([AddedToken(added[i]["content"], special=added[i]["special"], normalized=False)
                   for i in sorted(added)])
    assert all(hf.token_to_id(added[i]["content"]) == i for i in added)
    rows = _run_kaon(path, CORPUS, tmp_path)
    bad = [(s, r["ids"], hf.encode(s, add_special_tokens=False).ids) for s, r in zip(CORPUS, rows)
           if r["ids"] != hf.encode(s, add_special_tokens=False).ids]
    print(f"gguf pre={pre}: {len(CORPUS) - len(bad)}/{len(CORPUS)} id-equal")
    assert not bad, f"{len(bad)} differ, e.g.:\n" + "\n".join(f"  {s!r}\n    kaon {k}\n    hf   {w}" for s, k, w in bad[:6])
    for s, r in zip(CORPUS, rows):
        assert _dec(r["dec"]) == hf.decode(r["ids"], skip_special_tokens=False)
        assert r["inc"] == r["dec"] and r["inc_skip"] == r["dec_skip"]
