"""Our WordPiece (engine/data/wordpiece.h, through wordpiece_tool) against transformers'
BertTokenizer (the Python one, BasicTokenizer + WordpieceTokenizer) on multilingual text:
accented Latin, Turkish dotted I, German sharp s, Greek with capital sigma in final and
non-final places, Cyrillic, Arabic with marks, CJK ideographs and their compatibility forms,
kana, Hangul (precomposed and as jamo), emoji with modifiers and joiners, combining marks,
ligatures, control and format characters, every kind of Unicode space, U+FFFD, and random
code points from the whole range, special tokens written in the text. The vocabulary is trained on the same text with HF
`tokenizers` (its BertWordPieceTokenizer), and each tokenizer_config.json variant is checked:
do_lower_case, strip_accents true/false/unset, tokenize_chinese_chars false. Invalid UTF-8 is
refused by name.

  wordpiece_interop_test.py WORDPIECE_TOOL
"""
import json
import os
import random
import subprocess
import sys
import tempfile

from tokenizers import BertWordPieceTokenizer
from transformers import BertTokenizer

tool = sys.argv[1]
rng = random.Random(11)

pieces = [
    "café", "naïve", "Ångström", "façade", "jalapeño", "ÉCOLE", "İstanbul", "ıi", "Straße",
    "STRASSE", "ΟΔΟΣ", "Σίσυφος", "ΣΑΣ", "ὈΔΥΣΣΕΎΣ", "σς", "Σ.", "ΑΣ1", "Σ", "Москва",
    "ПРИВЕТ", "ёжик", "مَرْحَبًا", "العربية", "中文分词", "東京都", "漢字テスト", "豈更車",
    "ひらがな", "カタカナ", "한국어", "한글", "한", "😀", "👍🏽", "👩‍👩‍👧", "🇩🇪", "e\u0301",
    "a\u0308\u0301", "\u0345", "ﬁnance", "Ⅻ", "①", "x\u200by", "soft\u00adhyphen",
    "tab\there", "nbsp\u00a0gap", "line\u2028break", "para\u2029graph", "ideo\u3000space",
    "ctl\x01\x7f\x9fchars", "bom\ufeff", "repl\ufffdchar", "nul\x00", "don't", "U.S.A.",
    "¿Qué?", "«quoted»", "—dash–", "100%", "$5.00", "#tag", "@user", "a/b\\c", "x\u0300\u0301",
    "\u1e9b\u0323", "Ǆ", "ǅ", "ǆ", "\u0130\u0307", "ꭰ", "Ꭰ", "𐐀", "𐐨", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "lorem", "ipsum", "the", "quick", "brown", "fox", "THE", "Quick", "[CLS]", "x[SEP]y",
    "[MASK]", "[unk]", "[Pad]", "[PAD][PAD]",
]


def random_point():
    while True:
        c = rng.randrange(0x110000) if rng.random() < 0.5 else rng.randrange(0x3000)
        if not 0xD800 <= c <= 0xDFFF:
            return chr(c)


def line():
    words = []
    for _ in range(rng.randint(1, 14)):
        r = rng.random()
        if r < 0.75:
            words.append(rng.choice(pieces))
        elif r < 0.9:
            words.append("".join(random_point() for _ in range(rng.randint(1, 4))))
        else:
            words.append(rng.choice(pieces) + rng.choice(pieces))
    seps = [" ", " ", " ", "  ", "\t", "\u00a0", "\u2003", ""]
    text = ""
    for w in words:
        text += w + rng.choice(seps)
    return text


lines = [line() for _ in range(14000)]
# The tool reads one text per line: newlines (and what str.splitlines() would split) are out.
lines = [t.replace("\n", " ").replace("\r", " ") for t in lines]
total = sum(len(t.encode()) for t in lines)

with tempfile.TemporaryDirectory() as work:
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    failures = 0
    for variant in [
        {"do_lower_case": True},
        {"do_lower_case": False},
        {"do_lower_case": True, "strip_accents": False},
        {"do_lower_case": False, "strip_accents": True},
        {"do_lower_case": True, "tokenize_chinese_chars": False},
    ]:
        vocab_dir = os.path.join(work, "v" + str(abs(hash(json.dumps(variant))) % 10**8))
        os.makedirs(vocab_dir)
        trainer = BertWordPieceTokenizer(
            lowercase=variant["do_lower_case"],
            strip_accents=variant.get("strip_accents"),
            handle_chinese_chars=variant.get("tokenize_chinese_chars", True))
        trainer.train([corpus], vocab_size=3000, min_frequency=2, show_progress=False)
        trainer.save_model(vocab_dir)
        config = dict(variant, tokenizer_class="BertTokenizer")
        with open(os.path.join(vocab_dir, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
        ref = BertTokenizer(os.path.join(vocab_dir, "vocab.txt"),
                            do_lower_case=variant["do_lower_case"],
                            strip_accents=variant.get("strip_accents"),
                            tokenize_chinese_chars=variant.get("tokenize_chinese_chars", True))
        out = subprocess.run([tool, vocab_dir], input="\n".join(lines) + "\n",
                             capture_output=True, text=True, encoding="utf-8")
        assert out.returncode == 0, out.stderr
        ours = out.stdout.split("\n")[:-1]
        assert len(ours) == len(lines), (len(ours), len(lines))
        unk = ref.convert_tokens_to_ids("[UNK]")
        n_ids = n_unk = 0
        bad = 0
        for text, got in zip(lines, ours):
            want = ref.encode(text, add_special_tokens=False)
            got = [int(x) for x in got.split()]
            n_ids += len(want)
            n_unk += want.count(unk)
            if got != want:
                bad += 1
                if bad <= 5:
                    print(f"MISMATCH {variant}: {text!r}\n  ours {got}\n  want {want}")
        print(f"{variant}: {len(lines)} lines, {total} bytes, {n_ids} ids ({n_unk} [UNK]), "
              f"{bad} lines differ")
        failures += bad

    # Bytes that are not UTF-8 are refused with the line's position, never guessed.
    out = subprocess.run([tool, vocab_dir], input=b"ok\nbad \xff byte\n", capture_output=True)
    assert out.returncode != 0 and b"byte 4 is not valid UTF-8" in out.stderr, out.stderr

assert failures == 0, f"{failures} lines differ"
assert total > 1_000_000, total
print("PASS")
