#!/usr/bin/env python3
"""Interop test: Mammoth's GPT-2 byte-level BPE against Hugging Face `tokenizers`.

Our trainer writes vocab.json/merges.txt; Hugging Face loads them (BPE model, ByteLevel
pre-tokenizer without prefix space, ByteLevel decoder) and must produce the same token ids as
our encoder on multilingual text, and both must decode ids back to the exact text. Before that,
our pre-tokenizer's character classes and splits are compared with Hugging Face's, because a
pre-token boundary difference is the usual cause of id differences.

Usage: bpe_interop_test.py PATH/TO/bpe_tool
Needs a Python with `tokenizers` (the project venv: $MAMMOTH_PYTHON). Without it the test fails.
"""
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
except ImportError as e:
    sys.exit(
        f"FAIL: Python package 'tokenizers' is not importable by {sys.executable} ({e}).\n"
        "Create the project venv and point MAMMOTH_PYTHON at it:\n"
        "  /usr/bin/python3 -m venv --system-site-packages $HOME/.cache/mammoth/venv\n"
        "  $HOME/.cache/mammoth/venv/bin/pip install tokenizers\n"
        "  export MAMMOTH_PYTHON=$HOME/.cache/mammoth/venv/bin/python")

# The text whose ids must agree. Covers contractions (in and out of the regex's list), accents,
# German, Greek, Russian, Chinese, Japanese, Arabic, Hebrew, Hindi (combining vowel signs),
# Korean, emoji (with ZWJ sequences and skin tones), digits in several scripts, whitespace runs,
# tabs, CRLF, non-breaking and ideographic spaces, and trailing whitespace.
TEST_TEXT = (
    "Hello world! It's a test: we're sure they'll say I'd've done it, y'all. DON'T SHOUT'S.\n"
    "Café naïve résumé façade jalapeño Ångström — “quotes” and ‘single’ … ellipsis.\n"
    "Größe Straße Übermäßig schön, Fußgänger überqueren die Brücke.\n"
    "Ελληνικά: Καλημέρα κόσμε, τι κάνεις; Σήμερα είναι ωραία μέρα.\n"
    "Русский язык: Привет, мир! Съешь же ещё этих мягких французских булок.\n"
    "中文：你好，世界！我们今天学习分词。机器学习很有趣。\n"
    "日本語：こんにちは世界。カタカナとひらがなと漢字を混ぜる。東京は2024年に。\n"
    "العربية: مرحبا بالعالم! هذه جملة للاختبار ٣٤٥ ١٢.\n"
    "עברית: שלום עולם, זה מבחן.\n"
    "हिन्दी: नमस्ते दुनिया, यह एक परीक्षण है।\n"
    "한국어: 안녕하세요 세계\n"
    "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🇩🇪 ❤️ ✨🚀\n"
    "Digits: 0 12 345 6789 3.14159 1,000,000 ½ ² Ⅻ\n"
    "Whitespace:    four spaces,\ttab,\t\ttwo tabs,  \n\n\nthree newlines\r\nCRLF\u00a0nbsp\u3000ideo\n"
    "   leading spaces and trailing   "
)

# Fewer ids than the training text's distinct pre-tokens, so training fills the vocabulary.
VOCAB = 900

TRAIN_TEXT = (
    "The quick brown fox jumps over the lazy dog. She's here, they're there, we'll see.\n"
    "Les élèves étudient à l'école. Ça va très bien, merci! Où est la gare?\n"
    "Die Kinder spielen im Garten. Das Wetter ist heute schön und warm.\n"
    "Η γλώσσα είναι όμορφη. Οι άνθρωποι μιλούν ελληνικά στην Αθήνα.\n"
    "Москва — столица России. Люди говорят по-русски каждый день.\n"
    "我们喜欢学习新的语言。今天天气很好，我们去公园散步。世界很大。\n"
    "私は日本語を勉強しています。東京の天気はとても良いです。こんにちは。\n"
    "اللغة العربية جميلة. الناس يتحدثون العربية في القاهرة.\n"
    "नमस्ते, आप कैसे हैं? मैं ठीक हूँ, धन्यवाद।\n"
    "Numbers 2023 and 2024 and 100 and 42; emoji 😀😀 👍 🚀🚀.\n"
    "    indented code line\n\tand a tab\n\n"
)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run_tool(tool, *args):
    res = subprocess.run([tool, *args], capture_output=True)
    if res.returncode != 0:
        fail(f"{tool} {' '.join(args)} exited {res.returncode}: {res.stderr.decode(errors='replace')}")
    return res.stdout


def hf_class(pt, ch):
    """Recovers the regex class of one character from how Hugging Face splits probes."""
    if len(pt.pre_tokenize_str("x" + ch + "x")) == 1:
        return "L"
    if len(pt.pre_tokenize_str("1" + ch + "1")) == 1:
        return "N"
    if len(pt.pre_tokenize_str("!" + ch + "!")) == 1:
        return "O"
    return "S"


def check_classes(tool, pt):
    ours = run_tool(tool, "classes").decode("ascii")
    if len(ours) != 0x110000:
        fail(f"classes: expected 0x110000 letters, got {len(ours)}")
    mismatches = []
    compared = 0
    for c in range(0x110000):
        if 0xD800 <= c <= 0xDFFF:
            continue
        # Code points unassigned in this Python's Unicode database may be assigned in the newer
        # Unicode that Hugging Face's regex engine carries; they are not in our tables either.
        if unicodedata.category(chr(c)) == "Cn":
            continue
        compared += 1
        theirs = hf_class(pt, chr(c))
        if theirs != ours[c]:
            mismatches.append((hex(c), ours[c], theirs))
    print(f"classes: {compared} assigned code points compared (Python Unicode "
          f"{unicodedata.unidata_version}), {len(mismatches)} differ")
    if mismatches:
        fail(f"character classes differ from Hugging Face's (code point, ours, theirs): "
             f"{mismatches[:30]}")


def random_text(seed, n):
    rng = random.Random(seed)
    pieces = (list("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789") +
              [" ", " ", " ", " ", "  ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2003"] +
              ["'", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'x", "''"] +
              list(".,!?-\"()[]{}:;/\\#@$%^&*_+=~`|<>") +
              ["é", "ß", "Ж", "λ", "中", "日本", "ت", "ש", "न", "ि", "्", "\u0301", "٣", "²", "Ⅻ",
               "😀", "👍🏽", "\u200d", "\ufe0f", "…", "—", "“", "”"])
    return "".join(rng.choice(pieces) for _ in range(n))


def check_pretokens(tool, pt, tmp, name, text):
    path = os.path.join(tmp, name + ".txt")
    with open(path, "wb") as f:
        f.write(text.encode("utf-8"))
    ours = run_tool(tool, "pretokenize", path).decode("utf-8").split("\n")[:-1]
    theirs = [p for p, _ in pt.pre_tokenize_str(text)]
    if ours != theirs:
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if a != b:
                fail(f"pre-tokens of {name} differ at #{i}: ours {ours[max(0, i - 3):i + 3]} "
                     f"theirs {theirs[max(0, i - 3):i + 3]}")
        fail(f"pre-tokens of {name}: {len(ours)} ours vs {len(theirs)} theirs")
    print(f"pretokens {name}: {len(ours)} identical")


def check_ids(tool, hf, vocab, merges, tmp, name, text):
    path = os.path.join(tmp, name + ".txt")
    with open(path, "wb") as f:
        f.write(text.encode("utf-8"))
    ours = [int(x) for x in run_tool(tool, "encode", vocab, merges, path).split()]
    theirs = hf.encode(text).ids
    if ours != theirs:
        i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                 min(len(ours), len(theirs)))
        fail(f"ids of {name} differ at #{i}: ours {ours[max(0, i - 5):i + 5]} "
             f"theirs {theirs[max(0, i - 5):i + 5]} (lengths {len(ours)} vs {len(theirs)})")
    if hf.decode(ours) != text:
        fail(f"Hugging Face does not decode our ids of {name} back to the text")
    ids_path = os.path.join(tmp, name + ".ids")
    with open(ids_path, "w") as f:
        f.write(" ".join(map(str, theirs)))
    if run_tool(tool, "decode", vocab, merges, ids_path) != text.encode("utf-8"):
        fail(f"we do not decode Hugging Face's ids of {name} back to the text")
    ratio = len(text.encode("utf-8")) / max(1, len(ours))
    print(f"ids {name}: {len(ours)} identical, round trip exact both ways "
          f"({ratio:.2f} bytes/token)")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: bpe_interop_test.py PATH/TO/bpe_tool")
    tool = sys.argv[1]
    pt = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    with tempfile.TemporaryDirectory() as tmp:
        check_classes(tool, pt)
        fuzz = random_text(1234, 60000)
        check_pretokens(tool, pt, tmp, "test_text", TEST_TEXT)
        check_pretokens(tool, pt, tmp, "fuzz", fuzz)

        train_path = os.path.join(tmp, "train.txt")
        with open(train_path, "wb") as f:
            f.write((TRAIN_TEXT * 20).encode("utf-8"))
        vocab = os.path.join(tmp, "vocab.json")
        merges = os.path.join(tmp, "merges.txt")
        run_tool(tool, "train", str(VOCAB), vocab, merges, train_path, "@default")

        hf = Tokenizer(models.BPE.from_file(vocab, merges))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        hf.decoder = decoders.ByteLevel()
        if hf.get_vocab_size() != VOCAB or hf.token_to_id("<|endoftext|>") != VOCAB - 1:
            fail(f"Hugging Face sees vocab size {hf.get_vocab_size()} and <|endoftext|> id "
                 f"{hf.token_to_id('<|endoftext|>')}, expected {VOCAB} and {VOCAB - 1}")
        with open(merges, encoding="utf-8") as f:
            num_merges = sum(1 for line in f if line.strip() and not line.startswith("#"))
        if num_merges != VOCAB - 257:
            fail(f"merges.txt has {num_merges} merges, expected {VOCAB - 257}")

        check_ids(tool, hf, vocab, merges, tmp, "test_text", TEST_TEXT)
        check_ids(tool, hf, vocab, merges, tmp, "train_text", TRAIN_TEXT)
        check_ids(tool, hf, vocab, merges, tmp, "fuzz", fuzz)
    print("PASS")


if __name__ == "__main__":
    main()
