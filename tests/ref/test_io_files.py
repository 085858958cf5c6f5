"""kaon's model-file readers against the reference Python packages.

The C unit tests double as dump tools (`test_gguf --dump FILE`, `test_safetensors --dump PATH`,
`test_hf_config --dump DIR`, one JSON line per item). Files are written with the PyPI `gguf`,
`safetensors` and `tokenizers` packages and what kaon sees is compared with gguf.GGUFReader,
safetensors.safe_open and the `json` module. Bad files from make_bad_files.py must fail cleanly.

The kaon build is $KAON_BUILD (default <repo>/build); missing binaries fail the tests.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import gguf
import safetensors
import safetensors.numpy
from safetensors import safe_open

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import make_bad_files as mbf  # noqa: E402

BUILD = pathlib.Path(os.environ.get("KAON_BUILD", REPO / "build"))
MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SHARED_CONFIGS = pathlib.Path(os.environ.get("KAON_SHARED_CONFIGS", "/work/shared/configs"))
SANITIZER_MARKS = ("AddressSanitizer", "UndefinedBehaviorSanitizer", "runtime error:",
                   "LeakSanitizer")


def tool(name):
    p = BUILD / "tests" / name
    if not p.exists():
        pytest.fail(f"{p} is missing: build kaon's C tests first (cmake -B $KAON_BUILD && ninja "
                    f"-C $KAON_BUILD {name}), or point KAON_BUILD at a build folder")
    return p


def run_dump(name, path):
    r = subprocess.run([str(tool(name)), "--dump", str(path)], capture_output=True, timeout=300)
    for mark in SANITIZER_MARKS:
        assert mark not in r.stderr.decode(errors="replace"), r.stderr.decode(errors="replace")
    return r


def dump_lines(name, path):
    r = run_dump(name, path)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    # Strings may hold any bytes: keep them through surrogateescape.
    text = r.stdout.decode("utf-8", errors="surrogateescape")
    return [json.loads(line) for line in text.splitlines()]


def fnv1a(data: bytes) -> str:
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


# ---- GGUF --------------------------------------------------------------------------------------

VT = gguf.GGUFValueType


def reader_value(field):
    """(type, value, elem_type, count) of a GGUFReader field, in the dump's terms."""
    t = field.types[0]
    if t == VT.ARRAY:
        et = field.types[1]
        if et == VT.ARRAY:
            # GGUFReader flattens nested arrays; the outer count is the number of items in the
            # array header, which sits in parts[4] (key len, key, type, elem type, count).
            return int(t), None, int(et), int(field.parts[4][0])
        if et == VT.STRING:
            vals = [bytes(field.parts[i]) for i in field.data]
        else:
            vals = [field.parts[i].tolist()[0] for i in field.data]
        return int(t), vals, int(et), len(field.data)
    if t == VT.STRING:
        return int(t), bytes(field.parts[-1]), None, None
    return int(t), field.parts[-1].tolist()[0], None, None


def as_bytes(s):
    return s.encode("utf-8", errors="surrogateescape")


def compare_gguf(path, check_data=True, data_limit=None):
    lines = dump_lines("test_gguf", path)
    r = gguf.GGUFReader(str(path))
    head, kvs = lines[0], [x for x in lines[1:] if "key" in x]
    tensors = [x for x in lines[1:] if "tensor" in x]
    fields = [f for k, f in r.fields.items() if not k.startswith("GGUF.")]
    assert head["version"] == r.fields["GGUF.version"].parts[0][0]
    assert head["alignment"] == r.alignment
    assert head["kv_count"] == len(fields) == r.fields["GGUF.kv_count"].parts[0][0]
    assert head["tensor_count"] == len(r.tensors)
    assert head["file_size"] == os.path.getsize(path)
    assert [as_bytes(k["key"]) for k in kvs] == [f.name.encode() for f in fields]
    for k, f in zip(kvs, fields):
        t, val, et, n = reader_value(f)
        assert k["type"] == t, f.name
        assert k["found"], f.name
        if t == VT.ARRAY:
            assert (k["elem_type"], k["count"]) == (et, n), f.name
            if et == VT.STRING:
                assert [as_bytes(v) for v in k["value"]] == val, f.name
            elif et != VT.ARRAY:
                assert k["value"] == val, f.name
        elif t == VT.STRING:
            assert as_bytes(k["value"]) == val, f.name
        else:
            assert k["value"] == val, f.name
    for d, t in zip(tensors, r.tensors):
        assert as_bytes(d["tensor"]) == t.name.encode()
        assert d["dims"] == [int(x) for x in t.shape]
        assert d["type"] == int(t.tensor_type)
        assert d["offset"] == t.data_offset - r.data_offset
        assert d["nbytes"] == t.n_bytes
        if check_data and (data_limit is None or t.n_bytes <= data_limit):
            assert d["fnv1a"] == fnv1a(np.asarray(t.data).tobytes()), t.name
    return lines, r


@pytest.mark.parametrize("alignment", [8, 32, 64, 4096])
def test_gguf_all_types_match_reader(tmp_path, alignment):
    path = mbf.write_all_types_gguf(tmp_path / "all.gguf", alignment=alignment)
    lines, r = compare_gguf(path)
    kv = {x["key"]: x for x in lines if "key" in x}
    # Spot checks against the values written (beyond agreeing with GGUFReader).
    assert kv["t.u64"]["value"] == 2**62 + 12345
    assert kv["t.i64"]["value"] == -(2**62) - 3
    assert kv["t.f32"]["value"] == float(np.float32(0.1))
    assert kv["t.f64"]["value"] == -1.0 / 3.0
    assert kv["t.arr_u64"]["value"] == [0, 2**64 - 1, 2**63]
    assert kv["t.nested_i32"]["elem_type"] == VT.ARRAY and kv["t.nested_i32"]["count"] == 3
    assert kv["t.after_nested"]["value"] == 7
    assert kv["t.str"]["value"] == "héllo \"quoted\" \\ back\tslash\nnewline ✓"
    assert lines[0]["alignment"] == alignment
    types = {x["tensor"]: x["type"] for x in lines if "tensor" in x}
    assert types == {"w.f32": 0, "w.f16": 1, "w.f32_4d": 0, "w.bf16": 30, "w.q8_0": 8,
                     "w.q4_0": 2, "w.q4_1": 3, "w.q4_k": 12, "w.q6_k": 14}
    for x in lines:
        if "tensor" in x:
            assert x["offset"] % alignment == 0


def test_gguf_tensor_bytes_dequantize_like_reference(tmp_path):
    """The bytes kaon hands out are the bytes gguf.quants dequantizes to the written values."""
    path = mbf.write_all_types_gguf(tmp_path / "all.gguf", alignment=32)
    lines = dump_lines("test_gguf", path)
    r = gguf.GGUFReader(str(path))
    for t in r.tensors:
        d = next(x for x in lines if x.get("tensor") == t.name)
        raw = np.asarray(t.data)
        assert d["fnv1a"] == fnv1a(raw.tobytes())
        if t.tensor_type in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0):
            deq = gguf.quants.dequantize(raw, t.tensor_type)
            assert deq.shape[-1] == d["dims"][0]


def test_gguf_tiny_llama(tmp_path):
    path = mbf.write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    lines, _ = compare_gguf(path)
    names = [x["tensor"] for x in lines if "tensor" in x]
    assert "blk.1.ffn_down.weight" in names and len(names) == 2 + 9 * 2


def test_gguf_real_model_matches_reader():
    if not MODEL.exists():
        pytest.fail(f"{MODEL} is missing (setup scripts put it there)")
    # Checksums of every tensor up to 128 KB (norms, K/V projections) plus one Q projection;
    # the large ones would make the pure-Python FNV loop slow.
    lines, r = compare_gguf(MODEL, data_limit=1 << 17)
    head = lines[0]
    assert head["tensor_count"] == 272 and head["kv_count"] == 33
    kv = {x["key"]: x for x in lines if "key" in x}
    assert kv["tokenizer.ggml.tokens"]["count"] == 49152
    assert kv["tokenizer.ggml.tokens"]["value"][0] == "<|endoftext|>"
    assert kv["llama.block_count"]["value"] == 30
    t = next(t for t in r.tensors if t.name == "blk.0.attn_q.weight")
    d = next(x for x in lines if x.get("tensor") == t.name)
    assert d["fnv1a"] == fnv1a(np.asarray(t.data).tobytes())


# ---- safetensors -------------------------------------------------------------------------------

ST_DTYPES = {"F32": np.float32, "F16": np.float16}


def st_reference(paths):
    """{name: (dtype, shape, bytes or None)} from safetensors.safe_open (numpy)."""
    out = {}
    for p in paths:
        with safe_open(str(p), framework="numpy") as f:
            for k in f.keys():
                s = f.get_slice(k)
                dt, shape = s.get_dtype(), list(s.get_shape())
                data = f.get_tensor(k).tobytes() if dt in ST_DTYPES else None
                out[k] = (dt, shape, data)
    return out


def compare_st(path, ref, extra_bytes=None):
    lines = dump_lines("test_safetensors", path)
    assert lines[0]["count"] == len(ref)
    seen = {}
    for x in lines[1:]:
        assert x["found"]
        seen[x["tensor"]] = x
    assert set(seen) == set(ref)
    for k, (dt, shape, data) in ref.items():
        x = seen[k]
        assert x["dtype"] == dt and x["shape"] == shape, k
        if data is None:
            data = extra_bytes[k]
        assert x["nbytes"] == len(data) and x["fnv1a"] == fnv1a(data), k
    return lines


def write_bf16(path, tensors, metadata=None):
    """{name: float32 array} -> a BF16 safetensors file via the package's serializer; returns
    the raw bytes written for each tensor."""
    keep, specs, raws = [], {}, {}
    for k, v in tensors.items():
        raw = np.ascontiguousarray((v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
        keep.append(raw)
        specs[k] = safetensors.TensorSpec(dtype="bfloat16", shape=v.shape,
                                          data_ptr=raw.ctypes.data, data_len=raw.nbytes)
        raws[k] = raw.tobytes()
    safetensors.serialize_file(specs, str(path), metadata=metadata)
    return raws


def test_safetensors_single_file(tmp_path):
    rng = np.random.default_rng(3)
    tensors = {
        "model.embed_tokens.weight": rng.standard_normal((10, 8)).astype(np.float32),
        "model.norm.weight": rng.standard_normal(8).astype(np.float16),
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 4), np.float16),
        "four.d": rng.standard_normal((2, 3, 1, 5)).astype(np.float32),
        "quote\"and\\slash": np.ones(3, np.float32),
    }
    p = tmp_path / "model.safetensors"
    safetensors.numpy.save_file(tensors, str(p), metadata={"format": "pt"})
    compare_st(p, st_reference([p]))
    compare_st(tmp_path, st_reference([p]))  # the folder finds model.safetensors


def test_safetensors_bf16(tmp_path):
    rng = np.random.default_rng(4)
    p = tmp_path / "bf16.safetensors"
    raws = write_bf16(p, {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)})
    lines = compare_st(p, st_reference([p]), extra_bytes=raws)
    assert {x["tensor"]: x["dtype"] for x in lines[1:]} == {"a": "BF16", "b": "BF16"}


def test_safetensors_sharded_folder(tmp_path):
    rng = np.random.default_rng(5)
    s1 = {f"model.layers.{i}.w": rng.standard_normal((4, 4)).astype(np.float32) for i in range(3)}
    s2 = {"lm_head.weight": rng.standard_normal((6, 4)).astype(np.float16)}
    names = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
             "model-00003-of-00003.safetensors"]
    safetensors.numpy.save_file(s1, str(tmp_path / names[0]))
    safetensors.numpy.save_file(s2, str(tmp_path / names[1]))
    raws = write_bf16(tmp_path / names[2], {"model.norm.weight": rng.standard_normal(4)})
    wm = {k: names[0] for k in s1} | {k: names[1] for k in s2} | {"model.norm.weight": names[2]}
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": wm}))
    compare_st(tmp_path, st_reference([tmp_path / n for n in names]), extra_bytes=raws)

    # A tensor the index puts in the wrong shard fails, naming it.
    wm["model.layers.0.w"] = names[1]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    r = run_dump("test_safetensors", tmp_path)
    assert r.returncode == 2
    assert (b"tensor 'model.layers.0.w' is listed in shard 'model-00002-of-00003.safetensors' "
            b"but lies in") in r.stderr
    # A tensor missing from every shard.
    wm["model.layers.0.w"] = names[0]
    wm["model.layers.9.w"] = names[2]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    r = run_dump("test_safetensors", tmp_path)
    assert r.returncode == 2
    assert b"tensor 'model.layers.9.w' is missing from its shard 'model-00003" in r.stderr


def test_safetensors_unsupported_dtype_is_named(tmp_path):
    p = tmp_path / "int16.safetensors"
    safetensors.numpy.save_file({"ok": np.ones(2, np.float32),
                                 "model.layers.0.mlp.gate_proj.weight": np.ones((2, 2), np.int16)},
                                str(p))
    assert st_reference([p])["model.layers.0.mlp.gate_proj.weight"][0] == "I16"  # valid file
    r = run_dump("test_safetensors", p)
    assert r.returncode == 2
    assert b"tensor 'model.layers.0.mlp.gate_proj.weight' has dtype I16" in r.stderr


# ---- config.json -------------------------------------------------------------------------------

def hf_expected(cfg):
    """What kaon should read from a config, computed from the JSON with HF's defaults."""
    heads = cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    eos = cfg.get("eos_token_id")
    return {
        "arch_name": cfg["architectures"][0], "n_layers": cfg["num_hidden_layers"],
        "hidden_size": cfg["hidden_size"], "intermediate_size": cfg["intermediate_size"],
        "n_heads": heads, "n_kv_heads": cfg.get("num_key_value_heads") or heads,
        "head_dim": hd, "vocab_size": cfg["vocab_size"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "rms_norm_eps": float(np.float32(cfg["rms_norm_eps"])),
        "rope_theta": float(np.float32(cfg.get("rope_theta", 10000.0))),
        "tie_word_embeddings": cfg.get("tie_word_embeddings", False),
        "bos_token_id": -1 if cfg.get("bos_token_id") is None else cfg["bos_token_id"],
        "eos_token_ids": eos if isinstance(eos, list) else [eos],
        "torch_dtype": cfg.get("torch_dtype") or cfg.get("dtype") or "",
        "rope_interleaved": False,
    }


def check_deepseek(name, cfg, got):
    """MLA widths, DeepSeekMoE routing and YaRN as kaon reads a real DeepSeek / Kimi config."""
    nope, rope = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
    v3 = cfg["architectures"][0] == "DeepseekV3ForCausalLM"
    exp = {"arch": "deepseek3" if v3 else "deepseek2", "n_layers": cfg["num_hidden_layers"],
           "hidden_size": cfg["hidden_size"], "n_heads": cfg["num_attention_heads"],
           "n_kv_heads": cfg["num_attention_heads"], "head_dim": nope + rope, "rope_dim": rope,
           "qk_nope_head_dim": nope, "v_head_dim": cfg["v_head_dim"], "kv_lora_rank": cfg["kv_lora_rank"],
           "q_lora_rank": cfg["q_lora_rank"] or 0, "rope_interleaved": True,
           "n_experts": cfg["n_routed_experts"], "n_experts_used": cfg["num_experts_per_tok"],
           "moe_intermediate_size": cfg["moe_intermediate_size"],
           "shared_expert_intermediate_size": cfg["moe_intermediate_size"] * cfg["n_shared_experts"],
           "first_moe_layer": cfg["first_k_dense_replace"],
           "moe_scoring": 1 if v3 else 0, "moe_score_bias": v3,
           "moe_n_group": cfg["n_group"], "moe_topk_group": cfg["topk_group"],
           "moe_routed_scale": float(np.float32(cfg["routed_scaling_factor"])),
           "norm_topk_prob": cfg["norm_topk_prob"] if v3 else False,
           "n_nextn_layers": cfg.get("num_nextn_predict_layers", 0),
           "rope_theta": float(np.float32(cfg["rope_theta"]))}
    rs = cfg["rope_scaling"]
    exp.update({"rope_scaling": 3, "rope_factor": float(np.float32(rs["factor"])),
                "rope_original_max_pos": rs["original_max_position_embeddings"],
                "rope_beta_fast": float(np.float32(rs["beta_fast"])), "rope_beta_slow": float(np.float32(rs["beta_slow"])),
                "rope_mscale": float(np.float32(rs["mscale"])), "rope_mscale_all_dim": float(np.float32(rs["mscale_all_dim"]))})
    for k, v in exp.items():
        assert got[k] == v, (name, k, got[k], v)
    # mscale == mscale_all_dim in every released config: HF's cos/sin factor is 1.
    assert got["rope_attn_factor"] == 1.0


def shared_configs():
    if not SHARED_CONFIGS.is_dir():
        pytest.fail(f"{SHARED_CONFIGS} is missing (set KAON_SHARED_CONFIGS)")
    return sorted(SHARED_CONFIGS.glob("*.json"))


def test_hf_configs_match_json(tmp_path):
    checked = 0
    for src in shared_configs():
        cfg = json.loads(src.read_text())
        d = tmp_path / src.stem
        d.mkdir()
        shutil.copy(src, d / "config.json")
        r = run_dump("test_hf_config", d)
        if "text_config" in cfg:  # multimodal wrapper (Kimi-K2.5): its text model
            cfg = cfg["text_config"]
        rs = cfg.get("rope_scaling") or {}
        rtype = rs.get("rope_type") or rs.get("type")
        if rtype not in (None, "default", "llama3", "linear", "yarn"):
            assert r.returncode == 2
            assert f"rope_scaling type '{rtype}' is not supported".encode() in r.stderr
            continue
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        if "architectures" not in cfg and "model_type" not in cfg:
            # Not a Hugging Face config.json (DeepSeek's own inference config): nothing to name.
            assert got["arch_name"] == "" and got["arch"] == "unknown", got
            continue
        if "kv_lora_rank" in cfg:
            check_deepseek(src.name, cfg, got)
            checked += 1
            continue
        exp = hf_expected(cfg)
        for k, v in exp.items():
            assert got[k] == v, (src.name, k, got[k], v)
        assert got["qk_norm"] == cfg["architectures"][0].startswith("Qwen3")
        if rtype == "llama3":
            assert got["rope_scaling"] == 2 and got["rope_factor"] == rs["factor"]
            assert got["rope_original_max_pos"] == rs["original_max_position_embeddings"]
        checked += 1
    assert checked >= 6


def test_hf_generation_config_overrides(tmp_path):
    d = mbf.write_tiny_hf_dir(tmp_path / "m")
    (d / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [2, 0], "temperature": 0.3, "top_k": 5, "repetition_penalty": 1.2}))
    got = json.loads(run_dump("test_hf_config", d).stdout)
    assert got["eos_token_ids"] == [2, 0] and got["gen_top_k"] == 5
    assert got["gen_temperature"] == float(np.float32(0.3))
    assert got["gen_repetition_penalty"] == float(np.float32(1.2))
    assert got["tie_word_embeddings"] is True and got["head_dim"] == 8


# ---- bad files ---------------------------------------------------------------------------------

BAD_EXPECT = {
    "truncated_gguf": ("test_gguf", "lies outside the file"),
    "wrong_magic": ("test_gguf", "not a GGUF file"),
    "absurd_tensor_count": ("test_gguf", "tensor count 1152921504606846976 cannot fit"),
    "tensor_outside_file": ("test_gguf", "tensor 'blk.0.attn_q.weight' data ["),
    "wrong_dtype": ("test_gguf", "tensor 'blk.0.attn_q.weight' has ggml type 99"),
    "hf_no_config": ("test_hf_config", "hf_no_config: no config.json"),
    "hf_bad_safetensors": ("test_safetensors", "model.safetensors: header is not valid JSON"),
}


def test_bad_files_fail_cleanly(tmp_path):
    files = mbf.make_bad_files(tmp_path / "bad")
    assert set(files) == set(BAD_EXPECT) | {"missing_tensor"}
    for name, (tool_name, needle) in BAD_EXPECT.items():
        r = run_dump(tool_name, files[name])
        err = r.stderr.decode(errors="replace")
        assert r.returncode == 2, (name, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (name, err)
        assert needle in lines[0], (name, err)
        assert str(files[name]) in lines[0], (name, err)  # the message names the file
    # A missing tensor is the model loader's business: the file itself reads fine.
    lines = dump_lines("test_gguf", files["missing_tensor"])
    assert "blk.0.attn_q.weight" not in [x.get("tensor") for x in lines]
    assert "blk.0.attn_k.weight" in [x.get("tensor") for x in lines]
    # The valid parts of the bad HF folders are valid.
    assert run_dump("test_safetensors", files["hf_no_config"]).returncode == 0
    assert run_dump("test_hf_config", files["hf_bad_safetensors"]).returncode == 0


def test_truncated_real_model_prefixes(tmp_path):
    """Prefixes of the real file cut inside the metadata, the tensor infos and the data."""
    if not MODEL.exists():
        pytest.fail(f"{MODEL} is missing")
    data = MODEL.read_bytes()
    for n in (0, 3, 23, 24, 1000, 100_000, 1_785_000, 1_785_664, len(data) // 2, len(data) - 1):
        p = tmp_path / f"cut{n}.gguf"
        p.write_bytes(data[:n])
        r = run_dump("test_gguf", p)
        assert r.returncode == 2, n
        assert r.stderr.decode().startswith("error: "), n
