#!/usr/bin/env python3
"""Interop test: engine/data/tokenizer (tokenizer.json) against Hugging Face `tokenizers`.

There is no network here, so the tokenizers are built and trained with the `tokenizers` Python
API in the shapes that real model directories have:
  gpt2     ByteLevel pre-tokenizer (GPT-2's regex), <|endoftext|>, a non-special added token
  llama3   Split by Llama 3's regex + ByteLevel without regex, ignore_merges, <|begin_of_text|>
           added by a TemplateProcessing post-processor, reserved special tokens
  qwen2    NFC normalizer, Split by Qwen2's regex (single digits) + ByteLevel,
           <|im_start|>/<|im_end|>
  llama2   SentencePiece-style: Prepend("▁") + Replace(" ", "▁") normalizer, BPE with
           byte_fallback and fuse_unk, <0xNN> byte tokens, <s> added by the post-processor,
           decoder Replace/ByteFallback/Fuse/Strip; a limited alphabet so that rarer characters
           (CJK, emoji) go through the byte tokens
  mistral  SentencePiece-style with the Metaspace pre-tokenizer (prepend_scheme first) and
           decoder, lstrip/rstrip added tokens
  unk      Metaspace (always, split) without byte fallback: unknown characters fuse into <unk>
Each is saved as a model directory (tokenizer.json + tokenizer_config.json), and gpt2's model
also as vocab.json + merges.txt alone; our ids must equal
theirs on a multilingual text of about 1 MB (whole, and line by line), with and without
add_special_tokens, and our decoding of their ids (with and without skip_special_tokens) must
equal theirs. Files we cannot honour exactly (NFKC, an unknown regex, WordPiece, dropout, an
unknown key, malformed JSON) must be refused with an error naming what is refused.

Usage: tokenizer_interop_test.py PATH/TO/data_tool
"""
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)
except ImportError as e:
    sys.exit(f"FAIL: Python package 'tokenizers' is not importable by {sys.executable} ({e}); "
             "run tools/setup.sh and set MAMMOTH_PYTHON to its venv")

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SAMPLES = [
    "Hello world! It's a test: we're sure they'll say I'd've done it, y'all. DON'T SHOUT'S.",
    "Contractions in caps: IT'S, WE'RE, THEY'LL, I'M, YOU'VE, HE'D; long s: 'ſ and 'ſx.",
    "Café naïve résumé façade jalapeño Ångström — “quotes” and ‘single’ … ellipsis.",
    "Größe Straße Übermäßig schön, Fußgänger überqueren die Brücke.",
    "Ελληνικά: Καλημέρα κόσμε, τι κάνεις; Σήμερα είναι ωραία μέρα.",
    "Русский язык: Привет, мир! Съешь же ещё этих мягких французских булок.",
    "中文：你好，世界！我们今天学习分词。机器学习很有趣。",
    "日本語：こんにちは世界。カタカナとひらがなと漢字を混ぜる。東京は2024年に。",
    "العربية: مرحبا بالعالم! هذه جملة للاختبار ٣٤٥ ١٢.",
    "עברית: שלום עולם, זה מבחן.",
    "हिन्दी: नमस्ते दुनिया, यह एक परीक्षण है।",
    "한국어: 안녕하세요 세계",
    "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🇩🇪 ❤️ ✨🚀 🦙🦙🦙",
    "Digits: 0 12 345 6789 1234567 3.14159 1,000,000 ½ ² Ⅻ ٣٤٥٦",
    "Whitespace:    four spaces,\ttab,\t\ttwo tabs,  \n\n\nthree newlines\r\nCRLF\u00a0nbsp\u3000ideo",
    "   leading spaces and trailing   ",
    "code:\n    def f(x):\n        return x**2  # square\n\n\n",
    "Specials inside: <|endoftext|>next doc <s>bos</s> <|begin_of_text|>x<|eot_id|> "
    "<|im_start|>user\nhi<|im_end|> <|reserved_special_token_3|> <unk> <mask> a<extra>b",
    "Rare bytes: \u0000\u0001\u007f \u00ad\u200b\u2028\u2029 \U0001F9EA \U00010348 ꙮ \ufeff",
    "Punctuation runs: !!! ??? ... ---- ==> <== (parens) [brackets] {braces} \"q\" 'q'",
    # NFC: decomposed letters, marks to reorder, singletons, exclusions, Hangul jamo.
    "Cafe\u0301 re\u0301sume\u0301 a\u0323\u0301 a\u0301\u0323 o\u0308\u0304 \u212b \u2126 "
    "\u0344 \u0958 \u0915\u093c \u1100\u1161\u11a8 \u1100\u1161 \uac00\u11a8 "
    "\u0041\u030a\u0301 \u1e9b\u0323 \u0e33 \u3099\u304b\u3099 \U0001d15e",
    "",
    " ",
    "\n",
    "a",
]

WORDS = ("the of and to in is was for on that with as by at from it his an were are which "
         "this be or has had not but first one their its new after who they two her she "
         "been other when there all during into school time may years more most only over "
         "city some world would where later up such used many can state about national out "
         "known university united then made").split()


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def random_text(seed, n):
    rng = random.Random(seed)
    pieces = (list("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789") +
              [" ", " ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", "\u00a0",
               "\u3000", "\u2003", " \n", "\n "] +
              ["'", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "'x", "''",
               "'ſ"] +
              list(".,!?-\"()[]{}:;/\\#@$%^&*_+=~`|<>") +
              ["é", "ß", "Ж", "λ", "中", "日本", "ت", "ש", "न", "ि", "्", "\u0301", "٣", "²", "Ⅻ",
               "e", "\u0323", "\u0308", "\u1100", "\u1161", "\u11a8", "\uac00", "\u212b",
               "\u3099", "か",
               "😀", "👍🏽", "\u200d", "\ufe0f", "…", "—", "“", "”", "🦙", "ꙮ", "\U00010348"] +
              ["<s>", "</s>", "<|endoftext|>", "<|im_start|>", "<extra>", " <mask> "] +
              [" " + w for w in WORDS] * 3)
    return "".join(rng.choice(pieces) for _ in range(n))


def corpus():
    """About 1 MB of varied text: the samples, random mixtures and word salad."""
    rng = random.Random(7)
    parts = []
    size = 0
    i = 0
    while size < 1_050_000:
        if i % 5 == 0:
            t = SAMPLES[(i // 5) % len(SAMPLES)]
        elif i % 5 == 1:
            t = random_text(i, 400)
        else:
            t = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 80)))
            t = t.capitalize() + rng.choice([".", "!", "?", ".\n", "\n\n", ";"])
        parts.append(t)
        size += len(t.encode("utf-8"))
        i += 1
    return "\n".join(parts)


def train_text():
    rng = random.Random(3)
    lines = list(SAMPLES) * 30
    lines += [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(600)]
    lines += [random_text(100 + k, 300) for k in range(40)]
    return lines


def byte_level_tokenizer(split_regex, vocab, specials, ignore_merges, nfc=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    if split_regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_text(), trainer=trainer)
    return tok


def add_byte_tokens(tok):
    """Appends <0x00>..<0xFF> to the model vocabulary, as Llama 2's tokenizer.json has them."""
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    n = max(vocab.values()) + 1
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", n + b)
    return Tokenizer.from_str(json.dumps(j))


def sentencepiece_tokenizer(kind):
    specials = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=(kind != "unk")))
    if kind == "llama2":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                               normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    elif kind == "mistral":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                     split=False)
        tok.decoder = decoders.Sequence([decoders.ByteFallback(),
                                         decoders.Metaspace(replacement="▁",
                                                            prepend_scheme="first")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always",
                                                     split=True)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=specials, show_progress=False,
                                  limit_alphabet=150)
    tok.train_from_iterator(train_text(), trainer=trainer)
    if kind != "unk":
        tok = add_byte_tokens(tok)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def build(tmp):
    """name -> (directory, HF tokenizer)."""
    out = {}

    gpt2 = byte_level_tokenizer(None, 1200, ["<|endoftext|>"], False)
    gpt2.add_tokens(["<extra>", "hello world"])
    out["gpt2"] = (gpt2, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})

    l3_specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"] + [
        f"<|reserved_special_token_{i}|>" for i in range(6)]
    llama3 = byte_level_tokenizer(LLAMA3_RE, 1500, l3_specials, True)
    llama3.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", llama3.token_to_id("<|begin_of_text|>"))])])
    out["llama3"] = (llama3, {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"})

    qwen2 = byte_level_tokenizer(QWEN2_RE, 1300, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                 False, nfc=True)
    out["qwen2"] = (qwen2, {"bos_token": None, "eos_token": "<|im_end|>"})

    llama2 = sentencepiece_tokenizer("llama2")
    out["llama2"] = (llama2, {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
                              "add_eos_token": False})

    mistral = sentencepiece_tokenizer("mistral")
    mistral.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True,
                                           normalized=False)])
    mistral.add_tokens([AddedToken("<extra>", rstrip=True, normalized=False)])
    out["mistral"] = (mistral, {"bos_token": {"content": "<s>", "__type": "AddedToken"},
                                "eos_token": "</s>"})

    unk = sentencepiece_tokenizer("unk")
    out["unk"] = (unk, {"bos_token": "<s>", "eos_token": "</s>"})

    dirs = {}
    # GPT-2's two-file form (vocab.json + merges.txt, no tokenizer.json): Hugging Face's GPT-2
    # tokenizer treats <|endoftext|> as special.
    d = os.path.join(tmp, "gpt2_files")
    os.makedirs(d)
    gpt2.model.save(d)
    files = Tokenizer(models.BPE.from_file(os.path.join(d, "vocab.json"),
                                           os.path.join(d, "merges.txt")))
    files.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    files.decoder = decoders.ByteLevel()
    files.add_special_tokens(["<|endoftext|>"])
    dirs["gpt2_files"] = (d, files)
    for name, (tok, config) in out.items():
        d = os.path.join(tmp, name)
        os.makedirs(d)
        tok.save(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
        # Reload from the file, so both sides read the same bytes.
        dirs[name] = (d, Tokenizer.from_file(os.path.join(d, "tokenizer.json")))
    return dirs


def run_tool(tool, *args, expect_fail=False):
    res = subprocess.run([tool, *args], capture_output=True)
    if expect_fail:
        if res.returncode == 0:
            fail(f"{' '.join(args)} was accepted, expected a refusal")
        return res.stderr.decode(errors="replace")
    if res.returncode != 0:
        fail(f"{tool} {' '.join(args)} exited {res.returncode}: "
             f"{res.stderr.decode(errors='replace')}")
    return res.stdout


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# Tokens whose presence in Hugging Face's ids shows that a case was exercised at all.
MUST_SEE = {
    "gpt2": ["<|endoftext|>", "<extra>"],
    "gpt2_files": ["<|endoftext|>"],
    "llama3": ["<|begin_of_text|>", "<|reserved_special_token_3|>"],
    "qwen2": ["<|im_start|>", "<|im_end|>"],
    "llama2": ["<s>", "<0xF0>", "<0x9F>"],
    "mistral": ["<mask>", "<extra>", "<0xF0>"],
    "unk": ["<unk>"],
}


def check(tool, tmp, name, d, hf, texts):
    path = os.path.join(tmp, name + ".texts.json")
    with open(path, "w") as f:
        json.dump(texts, f)
    for special in (False, True):
        ours = json.loads(run_tool(tool, "hf-encode", d, path, "1" if special else "0"))
        theirs = [e.ids for e in hf.encode_batch(texts, add_special_tokens=special)]
        for k, (a, b) in enumerate(zip(ours, theirs)):
            if a != b:
                i = first_difference(a, b)
                text = texts[k]
                fail(f"{name}: ids of text #{k} ({len(text)} chars, add_special_tokens={special}) "
                     f"differ at #{i}: ours {a[max(0, i - 5):i + 5]} theirs {b[max(0, i - 5):i + 5]}"
                     f" = {[hf.id_to_token(t) for t in b[max(0, i - 5):i + 5]]}; text near there: "
                     f"{hf.decode(b[max(0, i - 8):i + 8])!r}")
        ids_path = os.path.join(tmp, name + ".ids.json")
        with open(ids_path, "w") as f:
            json.dump(theirs, f)
        for skip in (False, True):
            ours_text = json.loads(run_tool(tool, "hf-decode", d, ids_path, "1" if skip else "0"))
            theirs_text = hf.decode_batch(theirs, skip_special_tokens=skip)
            for k, (a, b) in enumerate(zip(ours_text, theirs_text)):
                if a != b:
                    i = first_difference(a, b)
                    fail(f"{name}: decoding text #{k} (skip_special_tokens={skip}) differs at "
                         f"char {i}: ours {a[max(0, i - 20):i + 20]!r} theirs "
                         f"{b[max(0, i - 20):i + 20]!r}")
        seen = {hf.id_to_token(i) for e in theirs for i in e}
        missing = [t for t in MUST_SEE[name] if t not in seen]
        if missing:
            fail(f"{name}: the texts never produce {missing}, so that case is untested")
    total = sum(len(t.encode("utf-8")) for t in texts)
    n = sum(len(e) for e in ours)
    print(f"{name}: {len(texts)} texts, {total} bytes, {n} ids identical; decoding identical")


def check_refusals(tool, tmp, dirs):
    base = json.load(open(os.path.join(dirs["llama3"][0], "tokenizer.json"), encoding="utf-8"))
    sp = json.load(open(os.path.join(dirs["llama2"][0], "tokenizer.json"), encoding="utf-8"))

    def variant(tag, j, expected, raw=None):
        d = os.path.join(tmp, "bad_" + tag)
        os.makedirs(d)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(raw if raw is not None else json.dumps(j))
        texts = os.path.join(tmp, "one.json")
        with open(texts, "w") as f:
            json.dump(["hello"], f)
        err = run_tool(tool, "hf-encode", d, texts, "0", expect_fail=True)
        if expected not in err:
            fail(f"refusal of {tag}: the error does not name '{expected}': {err}")
        print(f"refused {tag}: {err.strip().splitlines()[-1][:160]}")

    j = json.loads(json.dumps(base))
    j["normalizer"] = {"type": "NFKC"}
    variant("nfkc", j, "normalizer NFKC")
    j = json.loads(json.dumps(base))
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+|\s+"
    variant("regex", j, "pre_tokenizer Split pattern")
    j = json.loads(json.dumps(base))
    j["model"]["type"] = "WordPiece"
    variant("wordpiece", j, "model WordPiece")
    j = json.loads(json.dumps(sp))
    j["model"]["dropout"] = 0.1
    variant("dropout", j, "dropout")
    j = json.loads(json.dumps(sp))
    j["model"]["continuing_subword_prefix"] = "##"
    variant("prefix", j, "continuing_subword_prefix")
    j = json.loads(json.dumps(base))
    j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True
    variant("prefix_space", j, "add_prefix_space")
    j = json.loads(json.dumps(base))
    j["model"]["frobnicate"] = True
    variant("unknown_key", j, "frobnicate")
    j = json.loads(json.dumps(base))
    j["post_processor"] = {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]}
    variant("roberta", j, "post_processor RobertaProcessing")
    j = json.loads(json.dumps(sp))
    j["decoder"] = {"type": "CTC", "pad_token": "<pad>", "word_delimiter_token": "|",
                    "cleanup": True}
    variant("ctc", j, "decoder CTC")
    j = json.loads(json.dumps(base))
    j["added_tokens"][0]["single_word"] = True
    variant("single_word", j, "single_word")
    j = json.loads(json.dumps(base))
    j["truncation"] = {"max_length": 512, "strategy": "LongestFirst", "stride": 0,
                       "direction": "Right"}
    variant("truncation", j, "truncation")
    variant("malformed", None, "tokenizer", raw='{"model": {"type": "BPE", "vocab": {')
    # tokenizer_config.json naming a token the vocabulary lacks.
    d = os.path.join(tmp, "bad_config")
    os.makedirs(d)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(base, f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|no_such_token|>"}, f)
    err = run_tool(tool, "hf-info", d, expect_fail=True)
    if "<|no_such_token|>" not in err:
        fail(f"a bos_token outside the vocabulary is not named: {err}")
    print("refused a bos_token outside the vocabulary")
    # add_prefix_space in tokenizer_config.json makes transformers rebuild a Llama tokenizer.
    d = os.path.join(tmp, "bad_config_prefix")
    os.makedirs(d)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(sp, f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "add_prefix_space": True}, f)
    err = run_tool(tool, "hf-info", d, expect_fail=True)
    if "add_prefix_space" not in err:
        fail(f"add_prefix_space in tokenizer_config.json is not refused by name: {err}")
    print("refused add_prefix_space in a SentencePiece tokenizer's tokenizer_config.json")


def main():
    sys.stdout.reconfigure(line_buffering=True)  # progress shows even if the test is killed
    if len(sys.argv) != 2:
        sys.exit("usage: tokenizer_interop_test.py PATH/TO/data_tool")
    tool = sys.argv[1]
    big = corpus()
    lines = big.split("\n")[:3000] + SAMPLES
    fuzz = [random_text(1000 + k, 500) for k in range(20)]
    with tempfile.TemporaryDirectory() as tmp:
        dirs = build(tmp)
        # The pre-tokenizer first: a boundary difference is the usual cause of id differences.
        for name, digits in (("llama3", 3), ("qwen2", 1)):
            regex = LLAMA3_RE if digits == 3 else QWEN2_RE
            split = pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
            for k, text in enumerate(SAMPLES + fuzz):
                p = os.path.join(tmp, "pre.txt")
                with open(p, "wb") as f:
                    f.write(text.encode("utf-8"))
                ours = run_tool(tool, "pretokenize-llama3", p, str(digits)).decode("utf-8")
                theirs = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
                          .pre_tokenize_str(s)[0][0] if s else "" for s, _ in
                          split.pre_tokenize_str(text)]
                if ours.split("\n")[:-1] != theirs:
                    o = ours.split("\n")[:-1]
                    i = first_difference(o, theirs)
                    fail(f"{name} pre-tokens of text #{k} differ at #{i}: ours "
                         f"{o[max(0, i - 3):i + 3]} theirs {theirs[max(0, i - 3):i + 3]}")
            print(f"{name}: pre-tokens identical on {len(SAMPLES) + len(fuzz)} texts")
        # Hugging Face's qwen2 normalizes (so equal ids mean ours does too): e + U+0301 is é.
        q = dirs["qwen2"][1]
        if q.decode(q.encode("Cafe\u0301").ids) != "Caf\u00e9":
            fail("qwen2's NFC normalizer does not compose e + U+0301; the test would not see NFC")
        for name, (d, hf) in dirs.items():
            info = json.loads(run_tool(tool, "hf-info", d))
            if info["vocab_size"] != hf.get_vocab_size(with_added_tokens=True):
                fail(f"{name}: vocab size {info['vocab_size']}, Hugging Face says "
                     f"{hf.get_vocab_size(with_added_tokens=True)}")
            check(tool, tmp, name, d, hf, [big] + lines + fuzz)
        check_refusals(tool, tmp, dirs)
    print("PASS")


if __name__ == "__main__":
    main()
