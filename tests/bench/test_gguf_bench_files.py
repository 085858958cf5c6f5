"""The synthetic GGUF files of bench/gpu_decode_gguf.py (and bench/gpu_vs_llama_cpp.py, which runs
llama.cpp on them): a small config's F16 and Q4_0 files carry the SentencePiece vocabulary that
llama.cpp needs to load a file, read back with the `gguf` package, and kaon generates from them on
the CPU; kaon's `bench latency` table is parsed the way gpu_vs_llama_cpp.py parses it."""
import subprocess

import numpy as np
import pytest

import gpu_decode_gguf as gg
import gpu_vs_llama_cpp as vs
from conftest import BUILD

CFG = {"hidden_size": 256, "intermediate_size": 512, "vocab_size": 32000, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
       "rms_norm_eps": 1e-5, "rope_theta": 500000.0}


@pytest.mark.parametrize("qtype", ["F16", "Q4_0"])
def test_synthetic_file_loads_and_generates(tmp_path, qtype):
    gguf = pytest.importorskip("gguf")
    path = vs.write_file(tmp_path, "tiny", CFG, qtype)
    r = gguf.GGUFReader(str(path))
    f = r.fields
    assert bytes(f["tokenizer.ggml.model"].parts[-1]).decode() == "llama"
    assert len(f["tokenizer.ggml.tokens"].data) == CFG["vocab_size"]
    assert int(f["tokenizer.ggml.bos_token_id"].parts[-1][0]) == 1
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.ffn_up.weight"] == qtype
    assert types["output.weight"] == ("Q6_K" if qtype == "Q4_0" else "F16")
    if qtype == "F16":  # finite values of about the scale asked for
        w = np.asarray(next(t for t in r.tensors if t.name == "blk.1.attn_q.weight").data, dtype=np.float32)
        assert np.isfinite(w).all() and 0.01 < w.std() < 0.04
    out = gg.run_kaon(str(BUILD / "kaon"), path, 4, 8, device="cpu")
    assert out["generated"] == 8 and len(out["ids"]) == 8
    assert all(0 <= i < CFG["vocab_size"] for i in out["ids"])


def test_batched_row_parsed(tmp_path):
    gg_path = vs.write_file(tmp_path, "tiny", CFG, "F16")
    r = vs.kaon_batched(str(BUILD / "kaon"), gg_path, 4, 16, 8, "cpu")
    assert r["tok_s"] > 0 and r["step_ms"] > 0
    assert abs(r["tok_s"] - 4 * 1000.0 / r["step_ms"]) / r["tok_s"] < 0.01
