"""GGUF files of the tiny checkpoints, through the gguf package: writing a filled writer out, and
reading a file back as llama.cpp's loader sees it (one architecture's metadata; the tensors as
numpy arrays, those outside the blocks under their HF names)."""
import numpy as np

TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}  # llama.cpp's names outside the blocks -> HF's


def write_out(wr):
    """Writes a filled gguf.GGUFWriter to its file (header, metadata, tensors) and closes it."""
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def read(path, arch):
    """(kv, top, blocks) of a GGUF file of architecture arch: kv(key, default=None) is the
    metadata value `{arch}.{key}`; top the tensors of TOP_NAMES under their HF names; blocks
    {(layer, kind): array} for the tensors `blk.{layer}.{kind}.weight` (or .bias; layer as the
    string in the name). Arrays are float32 in numpy order (ggml's ne reversed), as stored."""
    import gguf
    r = gguf.GGUFReader(str(path))
    assert r.fields["general.architecture"].contents() == arch

    def kv(key, default=None):
        f = r.fields.get(f"{arch}.{key}")
        return f.contents() if f is not None else default
    top, blocks = {}, {}
    for t in r.tensors:
        a = np.asarray(t.data, np.float32).reshape([int(x) for x in reversed(t.shape)])
        if t.name in TOP_NAMES:
            top[TOP_NAMES[t.name]] = a
        else:
            _, layer, kind, _ = t.name.split(".")
            blocks[layer, kind] = a
    return kv, top, blocks
