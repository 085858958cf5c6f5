"""Deterministic test corpus and reference tokenizers for kaon's tokenizer tests.

- make_corpus(): >= 2,000 strings (seeded): handwritten samples in many scripts, code, emoji
  and ZWJ sequences, whitespace runs, digits of every length 1..30, special tokens inside text,
  unusual Unicode, the empty string, and random combinations of all of these.
- smollm2_reference(gguf): SmolLM2's tokenizer rebuilt with the `tokenizers` library from the
  GGUF's vocab and merges, with SmolLM2's real pre-tokenizer (Digits(individual_digits=True) +
  ByteLevel(add_prefix_space=False, use_regex=True)) and the token_type==3 tokens as special.
- `python3 tests/ref/tokenizer_corpus.py --make-fixtures` trains the small fixture tokenizers
  under tests/fixtures/tokenizers/ (Llama-3 and Qwen2 pre-tokenizers, SentencePiece-style BPE
  with byte fallback, as tokenizer.json and as a GGUF `llama` vocabulary).
"""
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "tokenizers"

# The split patterns of the real tokenizer.json files.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>",
            "<|end_of_text|>", "<s>", "</s>", "<unk>", "<repo_name>", "<file_sep>", "<mask>",
            "<tool_call>", "[WORD]", "<|start_header_id|>", "<|end_header_id|>"]
NEAR_SPECIALS = ["<|im_sta", "<|im_start|", "<|im_start>", "<|IM_START|>", "< s>", "<s", "</s",
                 "<|", "|>", "<<|im_end|>>", "<0x41>", "<0xZZ>", "[WORD", "<mas k>"]

HANDWRITTEN = [
    "", " ", "  ", "\n", "\t", "a", "Hello, world!", "Hello world", " Hello world", "Hello world ",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've done it, didn't they? We'd go. It's John's.",
    "I'M SURE YOU'LL SEE THEY'VE DONE IT. DON'T! WE'D. IT'S", "we'Ll yoU'rE i'M ſ's 'S 'ſ",
    "Ceci n'est pas une pipe — l'élève a déjà mangé à l'hôtel.",
    "Größenwahn ist eine Straße. Über Öl und Ärger: ß ẞ",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Привет, мир! Как дела? Всё хорошо.",
    "Γαζέες καὶ μυρτιὲς δὲν θὰ βρῶ πιὰ στὸ χρυσαφὶ ξέφωτο.",
    "我能吞下玻璃而不伤身体。今天天气很好，我们去公园散步吧！",
    "日本語のテキストです。ひらがな、カタカナ、漢字を含みます。",
    "한국어 문장입니다. 안녕하세요, 세계!",
    "مرحبا بالعالم! هذه جملة باللغة العربية.",
    "שלום עולם, זה משפט בעברית.",
    "नमस्ते दुनिया! यह हिंदी में एक वाक्य है।",
    "สวัสดีชาวโลก นี่คือประโยคภาษาไทย",
    "Tiếng Việt có dấu: Xin chào thế giới!",
    "def foo(x):\n    return x * 2  # double\n\nprint(foo(21))\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "const f = async (a, b) => { await g(a ?? b); return a?.b || `t${b}`; };",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%ann%';",
    "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "path/to/file_name.ext C:\\Windows\\System32 https://example.com/a?b=c&d=e#f",
    "x^2 + y^2 = z^2; ∀x ∈ ℝ: x² ≥ 0; ∑_{i=1}^{n} i = n(n+1)/2",
    "😀😃😄 👍🏽 👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇺🇸🇫🇷 #️⃣ 🧑🏿‍🚀",
    "emoji at end 🎉", "🎉 emoji at start", "mixed😀text👍here",
    "tab\tseparated\tvalues\t", "line1\nline2\r\nline3\rline4", "\n\n\n", "\r\n\r\n",
    "   leading spaces", "trailing spaces   ", "  both  ", "multiple     spaces    inside",
    "\t\t tabs and spaces \t\n mixed \n\t ", " \n \n ", "a\n\n\nb", "a \n b", "a\t\nb",
    "NBSP\u00a0between\u00a0words", "zero\u200bwidth\u200cjoiner\u200dhere\ufeffbom",
    "RTL \u200fmark\u200e and \u202aembedding\u202c", "combining: e\u0301 a\u0300 n\u0303 o\u0308\u0304",
    "Zalgo: Z\u0351\u036b\u0343a\u0310\u0352l\u0357g\u0315o\u0360", "astral: 𝐀𝐁𝐂 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𠀀𠀁 𐌰𐌱 🀄",
    "NEL\u0085char", "mongolian\u180evs", "ideographic\u3000space", "line\u2028sep\u2029para",
    "fullwidth：ＡＢＣ１２３", "superscripts x² x³ ½ ¼ ① ② Ⅻ", "arabic digits ٠١٢٣٤٥٦٧٨٩",
    "devanagari digits ०१२३", "1,234,567.89", "$100 €200 £300 ¥400", "3.14159265358979323846",
    "version 1.2.3-beta+build.45", "2024-01-15T10:30:00Z", "+1 (555) 123-4567",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<s>[INST] Hello [/INST] Hi</s>", "text<|endoftext|>more text", "<|im_end|><|im_end|>",
    " <|im_start|> spaced <|im_end|> ", "a<mask>b", "a <mask> b", "a   <mask>", "<mask>",
    "[WORD] alone", "in[WORD]side", "x [WORD] y", "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<repo_name>kaon<file_sep>main.c", "<0x41><0x42> literal byte token text",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "ababababababababababab",
    "!!!!!!!!!!!!!!!!!????????......", "=====================", "-----\n-----",
    "____init____", "camelCaseWordsAndPascalCase snake_case_words kebab-case-words",
    "ALLCAPS WORDS HERE", "MiXeD CaSe WoRdS", "a1b2c3d4e5", "abc123def456", "123abc",
    "'s 't 're 've 'm 'll 'd", "''''", "\"quoted\" 'single' `back`", "(parens) [brackets] {braces}",
    "¡Hola! ¿Qué tal?", "«guillemets» „quotes“ ‘single’ “double”", "… — – ‒ ‐",
]

SCRIPTS = {
    "latin": "abcdefghijklmnopqrstuvwxyz",
    "latin_acc": "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿœšžłńśźżąęğış",
    "cyrillic": "абвгдежзийклмнопрстуфхцчшщъыьэюяё",
    "greek": "αβγδεζηθικλμνξοπρστυφχψω",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "hebrew": "אבגדהוזחטיכלמנסעפצקרשת",
    "devanagari": "कखगघचछजझटठडढणतथदधनपफबभमयरलवशषसहािीुूेैोौं्",
    "thai": "กขคงจฉชซญดตถทนบปผพฟภมยรลวศษสหอฮะาิีึืุูเแโใไ่้๊๋",
    "cjk": "的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着下自之年过发后作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理心她本前开但因只从想实",
    "kana": "あいうえおかきくけこさしすせそたちつてとなにぬねのアイウエオカキクケコサシスセソ",
    "hangul": "가나다라마바사아자차카타파하국어문장입니안녕세계",
}
EMOJI = ["😀", "👍", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇺🇸", "🎉", "🔥", "✨", "🤖", "#️⃣", "🧑🏿‍🚀"]
PUNCT = list(".,;:!?()[]{}<>\"'`~@#$%^&*-_=+/\\|…—«»“”‘’·•") + ["...", "->", "=>", "::", "!=", "==", "//", "/*", "*/"]
WS = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\t\t", " \t ", "\u00a0", "\u3000",
      "\u2009", "\u200b", "\u0085", "\u2028", "\n\n\n  ", "    "]
ODD = ["\u0301", "\u0308", "\u200d", "\u200c", "\u200e", "\u200f", "\ufeff", "\u00ad", "\u180e",
       "\U0001d400", "\U00020000", "\U00010330", "\U0001f004", "\ufffd", "\u2060", "\u034f"]


def _word(rng, script=None):
    script = script or rng.choice(list(SCRIPTS))
    chars = SCRIPTS[script]
    n = rng.choice([1, 2, 3, 3, 4, 5, 6, 8, 12])
    w = "".join(rng.choice(chars) for _ in range(n))
    if script == "latin" and rng.random() < 0.3:
        w = w.capitalize() if rng.random() < 0.7 else w.upper()
    return w


def _digits(rng, n):
    return "".join(rng.choice("0123456789") for _ in range(n))


def _fragment(rng):
    r = rng.random()
    if r < 0.40:
        return _word(rng)
    if r < 0.52:
        return rng.choice(WS)
    if r < 0.62:
        return rng.choice(PUNCT)
    if r < 0.72:
        return _digits(rng, rng.randint(1, 12))
    if r < 0.79:
        return rng.choice(EMOJI)
    if r < 0.85:
        return rng.choice(SPECIALS + NEAR_SPECIALS)
    if r < 0.90:
        return rng.choice(ODD)
    if r < 0.95:
        return rng.choice(["'s", "'T", "'re", "'VE", "'m", "'ll", "'D", "n't"])
    return rng.choice(HANDWRITTEN)


def make_corpus(seed=1234, n_random=1500):
    rng = random.Random(seed)
    out = list(HANDWRITTEN)
    # Digits of every length, alone and in context.
    for n in range(1, 31):
        d = _digits(rng, n)
        out += [d, f"x{d}y", f" {d} ", f"{d}.{_digits(rng, 3)}", f"the year {d}!", f"{d}\n{d}"]
    # Whitespace runs: mixed, leading, trailing, between words.
    for _ in range(200):
        ws = "".join(rng.choice(WS) for _ in range(rng.randint(1, 6)))
        w = _word(rng)
        out.append(rng.choice([ws, ws + w, w + ws, w + ws + _word(rng), ws + w + ws, w + ws + rng.choice(PUNCT)]))
    # Unusual Unicode around words.
    for ch in ODD:
        out += [ch, "a" + ch, ch + "b", "word" + ch + "word", " " + ch + " ", ch * 3]
    # Special tokens inside text.
    for sp in SPECIALS + NEAR_SPECIALS:
        out += [sp, "x" + sp + "y", " " + sp, sp + " ", "a " + sp + " b", sp + sp, "\n" + sp + "\n"]
    # Sentences in each script.
    for script in SCRIPTS:
        for _ in range(15):
            out.append(" ".join(_word(rng, script) for _ in range(rng.randint(1, 10))) + rng.choice(["", ".", "!", "?", "\n"]))
    # Random combinations of everything.
    for _ in range(n_random):
        out.append("".join(_fragment(rng) for _ in range(rng.randint(1, 14))))
    # No lone surrogates anywhere (they are not valid UTF-8).
    return [s for s in out if not any(0xD800 <= ord(c) <= 0xDFFF for c in s)]


def training_text(seed=99, n=6000):
    """Text to train the fixture tokenizers: prose in several scripts, code, numbers."""
    rng = random.Random(seed)
    lines = [s for s in HANDWRITTEN if s] * 20
    vocab = {sc: [_word(rng, sc) for _ in range(60)] for sc in SCRIPTS}
    for _ in range(n):
        sc = rng.choice(list(SCRIPTS) + ["latin"] * 4)
        words = [rng.choice(vocab[sc]) for _ in range(rng.randint(3, 14))]
        sep = "" if sc in ("cjk", "kana") and rng.random() < 0.7 else " "
        line = sep.join(words)
        if rng.random() < 0.3:
            line += " " + _digits(rng, rng.randint(1, 6))
        if rng.random() < 0.2:
            line += rng.choice(PUNCT)
        if rng.random() < 0.1:
            line = "    " + line.replace(" ", "_") + "()\n"
        lines.append(line)
    return lines


def smollm2_reference(gguf_path):
    """HF `tokenizers` Tokenizer equivalent to SmolLM2's tokenizer.json, built from the GGUF."""
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    r = gguf.GGUFReader(str(gguf_path))

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    return tok


# ---------------------------------------------------------------------------------------
# Fixture training

def _train_byte_level(pattern, specials, extra_added, vocab_size, bos=None):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(ignore_merges=bos is not None))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(), trainer)
    tok.add_tokens(extra_added)
    bl = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    if bos:
        tp = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                           special_tokens=[(bos, tok.token_to_id(bos))])
        tok.post_processor = processors.Sequence([bl, tp])
    else:
        tok.post_processor = bl
    return tok


def _spm_merges(vocab, skip):
    """SentencePiece-style merges: every split of every token into two vocab tokens, ranked by
    the merged token's id (= its score order), as HF's SentencePiece converter does."""
    merges = []
    for tok, tid in sorted(vocab.items(), key=lambda kv: kv[1]):
        if tid in skip or len(tok) < 2:
            continue
        for cut in range(1, len(tok)):
            a, b = tok[:cut], tok[cut:]
            if a in vocab and b in vocab and vocab[a] not in skip and vocab[b] not in skip:
                merges.append((a, b))
    return merges


def _train_spm():
    """A Llama-2-style tokenizer.json: BPE with byte fallback, <0x00>..<0xFF> in the vocab,
    Prepend("▁") + Replace(" ", "▁") normalizer, no pre-tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    t0 = Tokenizer(models.BPE())
    t0.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=2500, show_progress=False, limit_alphabet=160)
    t0.train_from_iterator(training_text(), trainer)
    trained = json.loads(t0.to_str())["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for tok_, _ in sorted(trained.items(), key=lambda kv: kv[1]):
        if tok_ not in vocab:
            vocab[tok_] = len(vocab)
    skip = set(range(0, 259))
    merges = _spm_merges(vocab, skip)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["<unk>", "<s>", "</s>"]])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    return tok, vocab


def _write_spm_gguf(path, vocab):
    """The same vocabulary as a GGUF `llama` tokenizer: scores follow the merge order."""
    import gguf
    toks = sorted(vocab.items(), key=lambda kv: kv[1])
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list([t for t, _ in toks])
    w.add_token_scores([0.0 if i < 259 else -float(i) for _, i in toks])
    types = []
    for t, i in toks:
        types.append(2 if i == 0 else 3 if i < 3 else 6 if i < 259 else 1)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.add_chat_template("{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _save(tok, name, config):
    d = FIXTURES / name
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n")
    return d


def make_fixtures():
    from tokenizers import AddedToken
    llama3_specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    t = _train_byte_level(LLAMA3_PATTERN, llama3_specials,
                          [AddedToken("<mask>", special=True, lstrip=True, normalized=False)], 3000,
                          bos="<|begin_of_text|>")
    _save(t, "llama3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                        "chat_template": "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"})
    qwen_specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    t = _train_byte_level(QWEN2_PATTERN, qwen_specials,
                          [AddedToken("<tool_call>", special=False, normalized=False),
                           AddedToken("[WORD]", special=False, single_word=True, normalized=False),
                           AddedToken("</tool_call>", special=False, rstrip=True, normalized=False)], 3000)
    _save(t, "qwen2", {"bos_token": None, "eos_token": "<|im_end|>", "add_bos_token": False,
                       "chat_template": [{"name": "default", "template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"},
                                         {"name": "tool_use", "template": "unused"}]})
    tok, vocab = _train_spm()
    _save(tok, "spm", {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "add_eos_token": False})
    _write_spm_gguf(FIXTURES / "spm" / "tokenizer.gguf", vocab)
    # Mistral-style variant of the same vocabulary: Metaspace(prepend_scheme="first") instead
    # of the normalizer, Metaspace decoder.
    j = json.loads(tok.to_str())
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    d = FIXTURES / "spm_metaspace"
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}) + "\n")


if __name__ == "__main__":
    if "--make-fixtures" in sys.argv:
        make_fixtures()
        for p in sorted(FIXTURES.rglob("*")):
            if p.is_file():
                print(p.relative_to(REPO), p.stat().st_size)
    else:
        c = make_corpus()
        print(len(c), "strings")
