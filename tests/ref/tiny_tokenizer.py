"""The tiny Gemma-style SentencePiece tokenizer the tiny Gemma 3 and DeepSeek checkpoints carry
(300 tokens, so kaon can tokenize and apply a chat template): as Hugging Face files
(tokenizer.json, tokenizer_config.json, generation_config.json) and as a `llama` GGUF
vocabulary."""
import json
from pathlib import Path

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
N_BYTES_FROM = len(SPECIALS)  # <0x00>..<0xFF> follow the specials
_PIECES = (["\u2581"] + list("etaoinshrdlucmwfgypbvk")
           + ["\u2581t", "\u2581a", "th", "he", "in", "er", "an", "\u2581th", "\u2581the", "re", "on",
              "\u2581s", "at", "en", "nd"])
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' "
                 "else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
                 "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def tokenizer_vocab():
    """Gemma's layout in miniature: <pad> 0, <eos> 1, <bos> 2, <unk> 3, turn markers, the 256
    byte-fallback tokens, then SentencePiece pieces ("\u2581" marks a space): 300 tokens."""
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for p in _PIECES:
        vocab[p] = len(vocab)
    assert len(vocab) == 300, len(vocab)
    return vocab


def _merges(vocab):
    """SentencePiece-style merges: every split of a piece into two pieces, ranked by the merged
    piece's id (as HF's SentencePiece converter does)."""
    first = N_BYTES_FROM + 256
    out = []
    for tok, tid in sorted(vocab.items(), key=lambda kv: kv[1]):
        if tid < first or len(tok) < 2:
            continue
        for cut in range(1, len(tok)):
            a, b = tok[:cut], tok[cut:]
            if vocab.get(a, -1) >= first and vocab.get(b, -1) >= first:
                out.append([a, b])
    return out


def write_tokenizer(folder):
    """tokenizer.json + tokenizer_config.json as Gemma 3's are shaped: BPE with byte fallback,
    Replace(" " -> "\u2581") normalizer and no prefix space, <bos> prepended."""
    folder = Path(folder)
    vocab = tokenizer_vocab()
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, s in enumerate(SPECIALS)],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": _merges(vocab)},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "chat_template": CHAT_TEMPLATE}, ensure_ascii=False))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 2, "eos_token_id": [1, 5], "pad_token_id": 0}))


def add_to_gguf(wr, vocab_size):
    """The tokenizer as a `llama` (SentencePiece) GGUF vocabulary on a gguf.GGUFWriter: tokens,
    scores (pieces ranked by id), types (unknown, control, byte, normal), special ids, no
    prefix space, the chat template. vocab_size: the model's, which must be the tokenizer's."""
    vocab = tokenizer_vocab()
    assert len(vocab) == vocab_size, (len(vocab), vocab_size)
    toks = sorted(vocab.items(), key=lambda kv: kv[1])
    first = N_BYTES_FROM + 256
    wr.add_tokenizer_model("llama")
    wr.add_token_list([t for t, _ in toks])
    wr.add_token_scores([0.0 if i < first else -float(i - first) for _, i in toks])
    wr.add_token_types([2 if i == 3 else 3 if i < N_BYTES_FROM else 6 if i < first else 1 for _, i in toks])
    wr.add_bos_token_id(2)
    wr.add_eos_token_id(1)
    wr.add_unk_token_id(3)
    wr.add_pad_token_id(0)
    wr.add_add_bos_token(True)
    wr.add_add_eos_token(False)
    wr.add_add_space_prefix(False)
    wr.add_chat_template(CHAT_TEMPLATE)
