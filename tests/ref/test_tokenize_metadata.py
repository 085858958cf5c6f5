"""`kaon tokenize` / `kaon detokenize` read only a GGUF file's metadata, so a file whose tensors
kaon cannot compute with still tokenizes; `kaon info` lists the tensor types of a file (counts
and bytes), those kaon does not support included.

Files (written with the gguf package): the tiny llama of make_bad_files.py; the same with one
tensor's ggml type patched to 99 (a type no ggml knows: its size cannot be known); and a file
with the tiny tokenizer and tensors of IQ2_XXS and Q8_K (layouts ggml defines, no kaon kernels).
"""
import struct
import subprocess

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as QT
from make_bad_files import _tensor_field_pos, add_tiny_tokenizer, write_tiny_llama_gguf

TEXT = "the theory of the hen, then the hat"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokmeta")
    ok = write_tiny_llama_gguf(out / "ok.gguf")
    base = ok.read_bytes()
    type_pos, _, reader = _tensor_field_pos(ok, "blk.0.attn_q.weight")
    del reader
    unknown = out / "unknown_type.gguf"
    unknown.write_bytes(base[:type_pos] + struct.pack("<I", 99) + base[type_pos + 4:])

    rng = np.random.default_rng(5)
    w = gguf.GGUFWriter(str(out / "unsupported.gguf"), "llama")
    add_tiny_tokenizer(w)
    for name, qt, rows in [("a.iq2_xxs", QT.IQ2_XXS, 3), ("b.q8_k", QT.Q8_K, 2)]:
        size = gguf.GGML_QUANT_SIZES[qt][1]
        raw = rng.integers(0, 256, (rows, 2 * size), dtype=np.uint8)  # rows of 2 blocks
        w.add_tensor(name, raw, raw_dtype=qt)  # (the shape in bytes: 2 blocks a row)
    w.add_tensor("c.f32", rng.standard_normal((4, 8)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dict(ok=ok, unknown=unknown, unsupported=out / "unsupported.gguf")


def kaon(exe, *args, stdin=None):
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=60, input=stdin)


def test_tokenize_reads_only_the_metadata(kaon_bin, files):
    ref = kaon(kaon_bin, "tokenize", "-m", files["ok"], "--text", TEXT)
    assert ref.returncode == 0, ref.stderr
    ids = ref.stdout.strip()
    assert ids.startswith("[") and len(ids) > 2
    for name in ("unknown", "unsupported"):
        r = kaon(kaon_bin, "tokenize", "-m", files[name], "--text", TEXT)
        assert r.returncode == 0, (name, r.stderr)
        assert r.stdout.strip() == ids, name
        d = kaon(kaon_bin, "detokenize", "-m", files[name], "--ids", ids.strip("[]").replace(" ", ""))
        assert d.returncode == 0, (name, d.stderr)
        assert d.stdout.rstrip("\n") == TEXT, name


def test_model_loading_still_rejects_unknown_types(kaon_bin, files):
    r = kaon(kaon_bin, "run", "-m", files["unknown"], "--prompt-ids", "1,2", "-n", "1")
    assert r.returncode == 2
    assert "type 99" in r.stderr


def test_info_lists_the_tensor_types_of_a_file(kaon_bin, files):
    r = kaon(kaon_bin, "info", files["ok"])
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("tensor types:"))
    reader = gguf.GGUFReader(files["ok"])
    for qt in {t.tensor_type for t in reader.tensors}:
        ts = [t for t in reader.tensors if t.tensor_type == qt]
        mib = sum(int(t.n_bytes) for t in ts) / 1048576.0
        assert f"{qt.name} x{len(ts)} ({mib:.1f} MiB)" in line, (qt.name, line)
    assert f"[{len(reader.tensors)} tensors in the file]" in line

    r = kaon(kaon_bin, "info", files["unsupported"])
    assert r.returncode == 2  # no model in it; the file's types are listed all the same
    line = next(l for l in r.stdout.splitlines() if l.startswith("tensor types:"))
    assert "IQ2_XXS x1 (0.0 MiB, not supported)" in line and "Q8_K x1 (0.0 MiB, not supported)" in line, line
    assert "F32 x1 (0.0 MiB)" in line

    r = kaon(kaon_bin, "info", files["unknown"])
    assert r.returncode == 2
    assert "ggml type 99, layout unknown" in r.stdout
    assert [l for l in r.stderr.splitlines() if l.strip()] == [r.stderr.strip()]  # one error line
