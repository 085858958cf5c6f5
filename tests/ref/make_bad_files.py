"""Small model files for kaon's reader tests: valid tiny models and one bad file per class of
bad input.

    make_bad_files(outdir) -> {name: path}   one bad GGUF file or HF folder per class
    write_tiny_llama_gguf(path, skip=())     a valid 2-layer llama GGUF (~30 KB)
    write_tiny_hf_dir(path, ...)             a valid 2-layer HF folder (config, safetensors, tokenizer)
    write_all_types_gguf(path, alignment)    every metadata type, nested arrays, 7 tensor types
    make_fuzz_seeds(repo)                    (re)writes tests/fuzz/seeds/{gguf,safetensors,hf_config}

The valid files are written with the PyPI `gguf`, `safetensors` and `tokenizers` packages; the
bad ones are those files with one defect patched in, located with gguf.GGUFReader.

Command line: python3 tests/ref/make_bad_files.py OUTDIR   |   python3 tests/ref/make_bad_files.py --seeds
"""
import json
import os
import pathlib
import shutil
import struct
import sys

import numpy as np

import gguf
import safetensors.numpy
from gguf import GGMLQuantizationType as QT

REPO = pathlib.Path(__file__).resolve().parents[2]

# The tiny llama: head_dim 8, GQA 4:2, rows a multiple of 32 so the matrices can be quantized.
TINY = dict(dim=32, n_heads=4, n_kv_heads=2, ff=64, n_layers=2, ctx=256)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e"]
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
                 "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _byte_tokens():
    """GPT-2's byte -> printable unicode map, in byte order (the 256 base tokens)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tiny_vocab():
    """Token strings and types (3 = control, 1 = normal)."""
    tokens = SPECIAL_TOKENS + _byte_tokens() + [m.replace(" ", "") for m in MERGES]
    types = [3] * len(SPECIAL_TOKENS) + [1] * (len(tokens) - len(SPECIAL_TOKENS))
    return tokens, types


def _tiny_weights(seed=0):
    """HF-layout float32 weights: {hf_name: array [out, in]} plus the matching GGUF names."""
    rng = np.random.default_rng(seed)
    d, h, kv, ff = TINY["dim"], TINY["n_heads"], TINY["n_kv_heads"], TINY["ff"]
    hd = d // h
    vocab = len(tiny_vocab()[0])

    def w(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    out = [("model.embed_tokens.weight", "token_embd.weight", w(vocab, d)),
           ("model.norm.weight", "output_norm.weight", np.ones(d, np.float32))]
    for i in range(TINY["n_layers"]):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        out += [
            (p + "input_layernorm.weight", g + "attn_norm.weight", np.ones(d, np.float32)),
            (p + "self_attn.q_proj.weight", g + "attn_q.weight", w(h * hd, d)),
            (p + "self_attn.k_proj.weight", g + "attn_k.weight", w(kv * hd, d)),
            (p + "self_attn.v_proj.weight", g + "attn_v.weight", w(kv * hd, d)),
            (p + "self_attn.o_proj.weight", g + "attn_output.weight", w(d, h * hd)),
            (p + "post_attention_layernorm.weight", g + "ffn_norm.weight", np.ones(d, np.float32)),
            (p + "mlp.gate_proj.weight", g + "ffn_gate.weight", w(ff, d)),
            (p + "mlp.up_proj.weight", g + "ffn_up.weight", w(ff, d)),
            (p + "mlp.down_proj.weight", g + "ffn_down.weight", w(d, ff)),
        ]
    return out


def add_tiny_tokenizer(w):
    """The tiny gpt2 tokenizer's metadata (a byte-level vocabulary, two merges, a chat template)."""
    tokens, types = tiny_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def write_tiny_llama_gguf(path, skip=()):
    """A valid llama GGUF like the default model in miniature: token_embd Q8_0 (tied output),
    matrices Q4_1, norms F32, a gpt2 tokenizer. Tensors named in `skip` are left out."""
    tokens, types = tiny_vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(TINY["ctx"])
    w.add_embedding_length(TINY["dim"])
    w.add_block_count(TINY["n_layers"])
    w.add_feed_forward_length(TINY["ff"])
    w.add_head_count(TINY["n_heads"])
    w.add_head_count_kv(TINY["n_kv_heads"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(TINY["dim"] // TINY["n_heads"])
    w.add_vocab_size(len(tokens))
    w.add_file_type(3)
    add_tiny_tokenizer(w)
    for _, name, arr in _tiny_weights():
        if name in skip:
            continue
        if arr.ndim == 1:
            w.add_tensor(name, arr)
        else:
            qt = QT.Q8_0 if name == "token_embd.weight" else QT.Q4_1
            w.add_tensor(name, gguf.quants.quantize(arr, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return pathlib.Path(path)


def tiny_hf_config():
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": TINY["dim"], "intermediate_size": TINY["ff"],
        "num_attention_heads": TINY["n_heads"], "num_key_value_heads": TINY["n_kv_heads"],
        "num_hidden_layers": TINY["n_layers"], "vocab_size": len(tiny_vocab()[0]),
        "max_position_embeddings": TINY["ctx"], "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "rope_scaling": None, "tie_word_embeddings": True, "attention_bias": False,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
    }


def write_tiny_hf_dir(path, config=True, tokenizer=True):
    """A valid HF folder for the tiny llama (config.json, generation_config.json,
    model.safetensors, tokenizer.json, tokenizer_config.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if config:
        (path / "config.json").write_text(json.dumps(tiny_hf_config(), indent=2))
        (path / "generation_config.json").write_text(
            json.dumps({"bos_token_id": 1, "eos_token_id": 2, "do_sample": True,
                        "temperature": 0.7, "top_p": 0.9}, indent=2))
    safetensors.numpy.save_file({hf: arr for hf, _, arr in _tiny_weights()},
                                str(path / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer:
        tokens, _ = tiny_vocab()
        vocab = {t: i for i, t in enumerate(tokens)}
        tk = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in MERGES]))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        tk.add_special_tokens(SPECIAL_TOKENS)
        tk.save(str(path / "tokenizer.json"))
        (path / "tokenizer_config.json").write_text(json.dumps({
            "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False,
            "chat_template": CHAT_TEMPLATE}, indent=2))
    return path


def write_all_types_gguf(path, alignment=64, seed=1):
    """Every metadata type (scalars, strings, arrays of each, nested arrays) and tensors of
    types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K with a custom alignment."""
    VT = gguf.GGUFValueType
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment != 32:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 250)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -32000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**62 + 12345)
    w.add_int64("t.i64", -(2**62) - 3)
    w.add_float64("t.f64", -1.0 / 3.0)
    w.add_bool("t.bool_true", True)
    w.add_bool("t.bool_false", False)
    w.add_string("t.str", "héllo \"quoted\" \\ back\tslash\nnewline ✓")
    w.add_array("t.arr_str", ["a", "", "Ġthe", "<|im_end|>", "日本語"])
    w.add_array("t.arr_i32", [1, -2, 3, 2**31 - 1, -(2**31)])
    w.add_array("t.arr_f32", [0.5, -1.25, 3.0e-7, 1e30])
    w.add_array("t.arr_bool", [True, False, True])
    w.add_key_value("t.arr_u8", [0, 1, 255], VT.ARRAY, sub_type=VT.UINT8)
    w.add_key_value("t.arr_i8", [-128, 0, 127], VT.ARRAY, sub_type=VT.INT8)
    w.add_key_value("t.arr_u16", [0, 65535], VT.ARRAY, sub_type=VT.UINT16)
    w.add_key_value("t.arr_i16", [-32768, 32767], VT.ARRAY, sub_type=VT.INT16)
    w.add_key_value("t.arr_u32", [0, 2**32 - 1], VT.ARRAY, sub_type=VT.UINT32)
    w.add_key_value("t.arr_u64", [0, 2**64 - 1, 2**63], VT.ARRAY, sub_type=VT.UINT64)
    w.add_key_value("t.arr_i64", [-(2**63), 2**63 - 1], VT.ARRAY, sub_type=VT.INT64)
    w.add_key_value("t.arr_f64", [1e-300, -2.5], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_array("t.nested_i32", [[1, 2], [3], [4, 5, 6]])
    w.add_array("t.nested_str", [["x", "y"], ["zz"]])
    w.add_uint32("t.after_nested", 7)

    f32 = rng.standard_normal((3, 64)).astype(np.float32)
    w.add_tensor("w.f32", f32)
    w.add_tensor("w.f16", rng.standard_normal((5, 7)).astype(np.float16))
    w.add_tensor("w.f32_4d", rng.standard_normal((2, 3, 4, 5)).astype(np.float32))
    bf = (rng.standard_normal((4, 8)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    w.add_tensor("w.bf16", bf, raw_dtype=QT.BF16)
    for qt, shape in ((QT.Q8_0, (4, 64)), (QT.Q4_0, (2, 96)), (QT.Q4_1, (3, 32))):
        w.add_tensor(f"w.{qt.name.lower()}", gguf.quants.quantize(
            rng.standard_normal(shape).astype(np.float32), qt), raw_dtype=qt)
    # K-quants: any bytes form valid blocks for a reader.
    for qt, rows in ((QT.Q4_K, 2), (QT.Q6_K, 3)):
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        w.add_tensor(f"w.{qt.name.lower()}", rng.integers(0, 256, (rows, ts), dtype=np.uint8),
                     raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return pathlib.Path(path)


def _tensor_field_pos(data, name):
    """Byte positions of a tensor info's ggml type and offset fields."""
    r = gguf.GGUFReader(data)
    for t in r.tensors:
        if t.name == name:
            pos = t.field.offset + 8 + len(name.encode()) + 4 + 8 * len(t.shape)
            return pos, pos + 4, r
    raise KeyError(name)


def make_bad_files(outdir):
    """One bad input per class; returns {name: path}. Each must make kaon fail with one clear
    error (`kaon info` exits with status 2)."""
    out = pathlib.Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    base_path = write_tiny_llama_gguf(out / "_valid_tiny.gguf")
    base = base_path.read_bytes()
    files = {}

    def put(name, data):
        p = out / name
        p.write_bytes(data)
        files[name.split(".")[0]] = p

    put("truncated_gguf.gguf", base[: len(base) // 2])
    put("wrong_magic.gguf", b"GGUX" + base[4:])
    put("absurd_tensor_count.gguf", base[:8] + struct.pack("<Q", 2**60) + base[16:])

    type_pos, off_pos, reader = _tensor_field_pos(base_path, "blk.0.attn_q.weight")
    far = (len(base) * 4 // reader.alignment) * reader.alignment
    put("tensor_outside_file.gguf", base[:off_pos] + struct.pack("<Q", far) + base[off_pos + 8:])
    put("wrong_dtype.gguf", base[:type_pos] + struct.pack("<I", 99) + base[type_pos + 4:])
    del reader

    write_tiny_llama_gguf(out / "missing_tensor.gguf", skip=("blk.0.attn_q.weight",))
    files["missing_tensor"] = out / "missing_tensor.gguf"

    hf = out / "hf_no_config"
    shutil.rmtree(hf, ignore_errors=True)
    files["hf_no_config"] = write_tiny_hf_dir(hf, config=False)

    hf = out / "hf_bad_safetensors"
    shutil.rmtree(hf, ignore_errors=True)
    write_tiny_hf_dir(hf)
    st = bytearray((hf / "model.safetensors").read_bytes())
    st[8:8 + 16] = b"not json at all!"  # the header length stays; its JSON is garbage
    (hf / "model.safetensors").write_bytes(bytes(st))
    files["hf_bad_safetensors"] = hf

    base_path.unlink()
    return files


def make_fuzz_seeds(repo=REPO):
    """Small valid inputs (< 100 KB each) for the libFuzzer targets."""
    seeds = pathlib.Path(repo) / "tests" / "fuzz" / "seeds"
    for sub in ("gguf", "safetensors", "hf_config"):
        (seeds / sub).mkdir(parents=True, exist_ok=True)
    g = seeds / "gguf"
    write_tiny_llama_gguf(g / "tiny_llama.gguf")
    write_all_types_gguf(g / "all_types_a64.gguf", alignment=64)
    write_all_types_gguf(g / "all_types_a8.gguf", alignment=8)
    v2 = bytearray((g / "all_types_a8.gguf").read_bytes())
    v2[4:8] = struct.pack("<I", 2)
    (g / "all_types_v2.gguf").write_bytes(bytes(v2))
    (g / "empty_v3.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))

    s = seeds / "safetensors"
    rng = np.random.default_rng(2)
    safetensors.numpy.save_file({
        "a.weight": rng.standard_normal((4, 8)).astype(np.float32),
        "b.bias": rng.standard_normal(8).astype(np.float16),
        "c.scalar": np.array(1.5, np.float32),
        "d.empty": np.zeros((0, 3), np.float32),
        "e.4d": rng.standard_normal((2, 1, 2, 3)).astype(np.float16),
    }, str(s / "mixed.safetensors"), metadata={"format": "pt"})
    raw = (rng.standard_normal(6).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    blob = safetensors.serialize({"x.bf16": safetensors.TensorSpec(
        dtype="bfloat16", shape=(2, 3), data_ptr=raw.ctypes.data, data_len=raw.nbytes)})
    (s / "bf16.safetensors").write_bytes(bytes(blob))

    h = seeds / "hf_config"
    shared = pathlib.Path("/work/shared/configs")
    for name in ("meta-llama__Llama-3.1-8B-Instruct.json", "Qwen__Qwen3-8B.json",
                 "mistralai__Mixtral-8x7B-v0.1.json", "deepseek-ai__DeepSeek-V3.json",
                 "openai__gpt-oss-20b.json"):
        if (shared / name).exists():
            shutil.copy(shared / name, h / name)
    (h / "tiny_llama.json").write_text(json.dumps(tiny_hf_config(), indent=2))
    (h / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 128000, "do_sample": True, "eos_token_id": [128001, 128008, 128009],
         "temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05}, indent=2))
    (h / "qwen2_partial_linear.json").write_text(json.dumps(
        {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "num_attention_heads": 14,
         "head_dim": None, "partial_rotary_factor": 0.5,
         "rope_scaling": {"type": "linear", "factor": 2.0}, "eos_token_id": [1, 2]}))
    return seeds


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--seeds":
        print(make_fuzz_seeds())
    elif len(sys.argv) == 2:
        for k, v in make_bad_files(sys.argv[1]).items():
            print(f"{k}\t{v}")
    else:
        sys.exit(__doc__)
