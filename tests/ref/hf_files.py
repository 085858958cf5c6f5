"""Hugging Face checkpoint files written with numpy: model.safetensors (F32, BF16 or F16) and a
model folder (config.json + model.safetensors, optionally the tiny tokenizer's files)."""
import json
import struct
from pathlib import Path

import numpy as np

from bf16 import to_bf16_bits
from tiny_tokenizer import write_tokenizer

TORCH_DTYPE = {"F32": "float32", "BF16": "bfloat16"}  # safetensors dtype -> config.json's name


def write_safetensors(path, tensors, dtype="F32", keep_f32=()):
    """One safetensors file with every tensor in dtype (F32, BF16 or F16), except those whose
    names end with one of keep_f32, which stay F32, and those given as (dtype, raw array):
    written as the array's bytes under that dtype (F8_E4M3 codes as uint8)."""
    keep_f32 = tuple(keep_f32)
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        dt = "F32" if name.endswith(keep_f32) else dtype
        if isinstance(a, tuple):
            dt, a = a
            raw = np.ascontiguousarray(a).tobytes()
        elif dt == "BF16":
            raw = to_bf16_bits(a).tobytes()
        elif dt == "F16":
            raw = np.asarray(a, np.float16).tobytes()
        else:
            raw = np.ascontiguousarray(a, np.float32).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)))
        fh.write(h)
        for b in blobs:
            fh.write(b)


def write_folder(folder, config, tensors, dtype="F32", keep_f32=(), tokenizer=False, indent=2):
    """An HF model folder (created if needed): config.json (the dict config, json.dumps with
    indent), model.safetensors (write_safetensors), and with tokenizer the tiny tokenizer's
    files. Returns the folder as a Path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=indent))
    write_safetensors(folder / "model.safetensors", tensors, dtype, keep_f32)
    if tokenizer:
        write_tokenizer(folder)
    return folder
