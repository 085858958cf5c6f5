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
    string in the name). Arrays are float32 in numpy order (ggml's ne reversed): the stored values,
    dequantized by the gguf package for quantized types."""
    import gguf
    import gguf.quants
    r = gguf.GGUFReader(str(path))
    assert r.fields["general.architecture"].contents() == arch

    def kv(key, default=None):
        f = r.fields.get(f"{arch}.{key}")
        return f.contents() if f is not None else default
    top, blocks = {}, {}
    for t in r.tensors:
        # dequantized by the gguf package (float types pass through), so quantized files read too
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape([int(x) for x in reversed(t.shape)])
        if t.name in TOP_NAMES:
            top[TOP_NAMES[t.name]] = a
        else:
            _, layer, kind, _ = t.name.split(".")
            blocks[layer, kind] = a
    return kv, top, blocks


GGUF_TO_HF = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def unpermute_qk(w, n_head):
    rows = w.shape[0]
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf_reference(path):
    """(HF-style config, HF-named float32 weights dequantized by the gguf package, the vocabulary
    or None) of a llama-architecture GGUF file: what refmodel.RefModel takes."""
    import gguf
    r = gguf.GGUFReader(str(path))

    def field(k):
        return r.fields[k].contents()

    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": int(field("llama.embedding_length")),
        "intermediate_size": int(field("llama.feed_forward_length")),
        "num_hidden_layers": int(field("llama.block_count")),
        "num_attention_heads": int(field("llama.attention.head_count")),
        "num_key_value_heads": int(field("llama.attention.head_count_kv")),
        "rms_norm_eps": float(field("llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field("llama.rope.freq_base")),
    }
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        a = a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim > 1 or len(t.shape) > 1 else a
        name = t.name
        if name == "token_embd.weight":
            w["model.embed_tokens.weight"] = a
        elif name == "output_norm.weight":
            w["model.norm.weight"] = a
        elif name == "output.weight":
            w["lm_head.weight"] = a
        else:
            _, l, rest = name.split(".", 2)
            hf = GGUF_TO_HF[rest]
            if rest == "attn_q.weight":
                a = unpermute_qk(a, nh)
            elif rest == "attn_k.weight":
                a = unpermute_qk(a, nkv)
            w[f"model.layers.{l}.{hf}"] = a
    tf = r.fields.get("tokenizer.ggml.tokens")  # (synthetic test files have none)
    tokens = [bytes(tf.parts[i]).decode("utf-8", "replace") for i in tf.data] if tf else None
    return cfg, w, tokens
