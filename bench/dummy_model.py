#!/usr/bin/env python3
"""Prepares a folder for `kaon serve --load-format dummy`: the config.json of a real model (e.g.
bench/configs/meta-llama__Llama-3.1-8B-Instruct.json) plus a tokenizer covering its whole
vocabulary, so a serving benchmark on random weights streams text token by token as a real model
does (kaon sends a stream chunk only when there is text; without a tokenizer a dummy model's
stream would carry one chunk at the end, and TTFT/ITL would mean nothing).

    python3 bench/dummy_model.py bench/configs/meta-llama__Llama-3.1-8B-Instruct.json OUT_DIR

The tokenizer is the small Llama-3-style test tokenizer (tests/fixtures/tokenizers/llama3: 3,001
tokens with merges) with synthetic tokens " w<id>" filling the ids up to vocab_size: text encodes
to the test tokenizer's ids, every id decodes to a few characters. Prompts for the benchmark are
best sent as token ids (bench/serve.py --random-vocab-size N), which needs no tokenizer at all.
"""
import argparse
import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "tests" / "fixtures" / "tokenizers" / "llama3"


def make(config, out_dir, base=BASE):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads(Path(config).read_text())
    vocab_size = int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size"))
    tok = json.loads((Path(base) / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    used = set(vocab.values()) | {a["id"] for a in tok.get("added_tokens", [])}
    if max(used) >= vocab_size:
        raise SystemExit(f"the base tokenizer has ids up to {max(used)}: more than the config's vocab_size {vocab_size}")
    for i in range(vocab_size):
        if i not in used:
            vocab[f"\u0120w{i}"] = i  # byte-level "Ġ" is a space: decodes to " w<i>"
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    shutil.copy(Path(base) / "tokenizer_config.json", out / "tokenizer_config.json")
    if Path(config).resolve() != (out / "config.json").resolve():
        shutil.copy(config, out / "config.json")
    return out, vocab_size


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="a config.json (bench/configs/*.json)")
    ap.add_argument("out_dir")
    a = ap.parse_args()
    out, v = make(a.config, a.out_dir)
    print(f"{out}: config.json + tokenizer.json ({v} tokens)")


if __name__ == "__main__":
    main()
