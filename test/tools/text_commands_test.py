#!/usr/bin/env python3
"""Text through the mammoth commands with a model directory's tokenizer, against HF `tokenizers`.

Model directories are a tiny GPT-2 config.json (fresh weights, --fresh-init) beside a
tokenizer.json built with the `tokenizers` Python API: a Llama 3 style byte-level BPE and a
Llama 2 style SentencePiece BPE with byte fallback. Checks:
  - generate --prompt: the prompt ids are Hugging Face's encode(prompt, add_special_tokens=True)
    and the text written to stdout is Hugging Face's decode of the new ids (skip special);
    --prompt-tokens keeps printing its JSON line;
  - data --tokenizer: the shard ids are [bos] + encode(document) per document, uint16 ids;
    with a vocabulary above 65536 the shards are uint32 (llm.c's 20240801 / 7 header), their
    ids equal Hugging Face's, some above 65535, and `train --data` trains on them;
  - eval --text: the same loss as eval --tokens on the shard of the same ids, the token count
    and exp(loss) as perplexity;
  - a tokenizer.json we cannot honour (NFKC) is refused by data, naming it; a text command on a
    registered model without --tokenizer says to pass one.

Usage: text_commands_test.py PATH/TO/mammoth
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors, trainers
except ImportError as e:
    sys.exit(f"FAIL: Python package 'tokenizers' is not importable by {sys.executable} ({e})")

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TEXT = ("The quick brown fox jumps over the lazy dog. It's 2024, and we're testing 12345 "
        "tokens: café, naïve, 東京, Привет, 😀🦙!\n\n  Indented line\twith a tab.\n")


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(mammoth, *args, expect_fail=False):
    res = subprocess.run([mammoth, *args], capture_output=True)
    out, err = res.stdout.decode("utf-8"), res.stderr.decode("utf-8", errors="replace")
    if expect_fail:
        if res.returncode != 1:
            fail(f"mammoth {' '.join(args)}: expected exit 1 (a refusal), got {res.returncode}: "
                 f"{err}")
        return out, err
    if res.returncode != 0:
        fail(f"mammoth {' '.join(args)} exited {res.returncode}:\n{err}")
    return out, err


def training_lines():
    words = ("the of and to in is was for on that with as by at from it his an were are which "
             "this be or has had not but first one their its new after who they two").split()
    lines = [TEXT] * 20
    for i in range(400):
        lines.append(" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(20)) + f" {i}.")
    return lines


def llama3_tokenizer():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                  special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_lines(), trainer=trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    return tok, {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}


def llama2_tokenizer():
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False, limit_alphabet=60,
                                  special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(training_lines(), trainer=trainer)
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    n = max(vocab.values()) + 1
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = n + b
    tok = Tokenizer.from_str(json.dumps(j))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok, {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}


WIDE_VOCAB = 130_000


def wide_tokenizer():
    """A byte-level BPE of 130,000 ids (Llama 3's size class): the 256 bytes, unused filler
    tokens, then every pair of bytes as a merge (so text maps to ids above 65535), and bos/eos."""
    chars = sorted(pre_tokenizers.ByteLevel.alphabet())  # one character per byte value
    vocab = {chars[b]: b for b in range(256)}
    fillers = WIDE_VOCAB - 256 - 256 * 256 - 2
    for i in range(fillers):
        vocab[chars[i % 256] + chars[(i // 256) % 256] + chars[i // 65536] + "~"] = len(vocab)
    merges = []
    for a in range(256):
        for b in range(256):
            vocab[chars[a] + chars[b]] = len(vocab)
            merges.append(f"{chars[a]} {chars[b]}")
    assert len(vocab) == WIDE_VOCAB - 2
    added = [{"id": len(vocab) + k, "content": name, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for k, name in enumerate(["<|begin_of_text|>", "<|end_of_text|>"])]
    j = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": merges},
    }
    return Tokenizer.from_str(json.dumps(j)), {"bos_token": "<|begin_of_text|>",
                                               "eos_token": "<|end_of_text|>"}


def write_megatron(prefix, ids):
    """A Megatron MMIDIDX pair (int32 elements) holding `ids` as one document of one sequence."""
    with open(prefix + ".bin", "wb") as f:
        f.write(struct.pack(f"<{len(ids)}i", *ids))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, 1, 2))
        f.write(struct.pack("<i", len(ids)) + struct.pack("<q", 0) + struct.pack("<2q", 0, 1))


def model_dir(tmp, name, tok, config):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "vocab_size": vocab, "n_positions": 256, "n_embd": 32,
                   "n_layer": 2, "n_head": 2}, f)
    return d, Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


def read_shard(path):
    with open(path, "rb") as f:
        raw = f.read()
    magic, version, n = struct.unpack("<3i", raw[:12])
    width = {(20240520, 1): 2, (20240801, 7): 4}.get((magic, version))
    if width is None:
        fail(f"{path}: header magic {magic} version {version}")
    body = raw[1024:]
    if len(body) != n * width:
        fail(f"{path}: {len(body)} bytes for {n} tokens of {width} bytes")
    return width, list(struct.unpack(f"<{n}{'H' if width == 2 else 'I'}", body))


def check_generate(mammoth, name, d, hf):
    prompt = "Hello world, it's 2024 — café 😀"
    out, err = run(mammoth, "generate", "--model", d, "--fresh-init", "--prompt", prompt,
                   "--max-new-tokens", "24", "--temperature", "0.9", "--top-k", "50",
                   "--eos-token", "999999999", "--threads", "1")
    result = json.loads(err.strip().splitlines()[-1])
    want_prompt = hf.encode(prompt, add_special_tokens=True).ids
    if result["prompt"] != want_prompt:
        fail(f"{name} generate: prompt ids {result['prompt']}, Hugging Face: {want_prompt}")
    if not result["tokens"]:
        fail(f"{name} generate: no tokens")
    # The continuation is what decoding prompt + new ids adds to decoding the prompt.
    full = hf.decode(result["prompt"] + result["tokens"], skip_special_tokens=True)
    base = hf.decode(result["prompt"], skip_special_tokens=True)
    if not full.startswith(base):
        fail(f"{name}: Hugging Face's decoding of the prompt is not a prefix of the whole")
    want = full[len(base):]
    if out != want + "\n" or result["text"] != want:
        fail(f"{name} generate: stdout {out!r}, JSON text {result['text']!r}, Hugging Face "
             f"{want!r}")
    print(f"{name} generate --prompt: {len(result['prompt'])} prompt ids and "
          f"{len(result['tokens'])} new ones as Hugging Face encodes/decodes them: {want!r}")
    out, _ = run(mammoth, "generate", "--model", d, "--fresh-init", "--prompt-tokens",
                 ",".join(map(str, want_prompt)), "--max-new-tokens", "3", "--temperature", "0")
    if json.loads(out)["prompt"] != want_prompt:
        fail(f"{name} generate --prompt-tokens: {out}")


def check_data_and_eval(mammoth, tmp, name, d, hf, docs_text, expect_width, train=False):
    text_dir = os.path.join(tmp, name + "_text")
    os.makedirs(text_dir)
    with open(os.path.join(text_dir, "a.txt"), "w", encoding="utf-8") as f:
        f.write(docs_text)
    with open(os.path.join(text_dir, "b.txt"), "w", encoding="utf-8") as f:
        f.write(TEXT)
    out_dir = os.path.join(tmp, name + "_shards")
    run(mammoth, "data", "--out", out_dir, "--tokenizer", d, "--val-fraction", "0", "--quiet",
        text_dir)
    width, ids = read_shard(os.path.join(out_dir, "train_000000.bin"))
    bos = hf.token_to_id(json.load(open(os.path.join(d, "tokenizer_config.json")))["bos_token"])
    want = []
    for text in (docs_text, TEXT):
        for doc in text.split("<|endoftext|>"):
            if doc:
                want += [bos] + hf.encode(doc, add_special_tokens=False).ids
    if ids != want:
        i = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
        fail(f"{name} data --tokenizer: shard ids differ from Hugging Face's at #{i}: "
             f"{ids[max(0, i - 4):i + 4]} vs {want[max(0, i - 4):i + 4]} "
             f"(lengths {len(ids)} vs {len(want)})")
    if width != expect_width:
        fail(f"{name} data: uint{8 * width} ids, expected uint{8 * expect_width}")
    if expect_width == 4 and max(ids) <= 65535:
        fail(f"{name} data: no id above 65535, so uint32 is not exercised")
    if not os.path.exists(os.path.join(out_dir, "tokenizer.json")):
        fail(f"{name} data: tokenizer.json was not copied beside the shards")
    print(f"{name} data --tokenizer: {len(ids)} ids as Hugging Face's, uint{8 * width} "
          f"(max id {max(ids)})")

    if train:
        # The same ids as a Megatron pair: eval reads both alike, train takes both.
        prefix = os.path.join(tmp, name + "_megatron")
        write_megatron(prefix, ids)
        common = ["eval", "--model", d, "--fresh-init", "--seq-len", "16", "--batch", "4",
                  "--threads", "1"]
        shard_loss = json.loads(run(mammoth, *common, "--tokens", out_dir)[0])
        for spec in (prefix, prefix + ".bin", prefix + ".idx"):
            mega_loss = json.loads(run(mammoth, *common, "--tokens", spec)[0])
            if mega_loss != shard_loss:
                fail(f"{name}: eval --tokens {spec} gives {mega_loss}, the shard {shard_loss}")
        for spec in (out_dir, prefix):
            out, err = run(mammoth, "train", "--model", d, "--fresh-init", "--data", spec,
                           "--steps", "2", "--seq-len", "16", "--micro-batch", "2",
                           "--eval-every", "0", "--threads", "1", "--warmup", "1",
                           "--val-fraction", "0.2", "--log-every", "1")
            if "step" not in out + err:
                fail(f"{name} train --data {spec} printed no step:\n{out}\n{err}")
        print(f"{name}: vocabulary {hf.get_vocab_size(with_added_tokens=True)}; eval and train "
              "read the uint32 shards and the Megatron pair (PREFIX, .bin, .idx) alike")
        return

    # eval --text equals eval --tokens over the same ids: one document, so the shard of
    # `data` is exactly encode(text, add_special_tokens=True) for a bos template.
    single = os.path.join(tmp, name + "_single.txt")
    with open(single, "w", encoding="utf-8") as f:
        f.write(TEXT * 6)
    single_out = os.path.join(tmp, name + "_single")
    run(mammoth, "data", "--out", single_out, "--tokenizer", d, "--val-fraction", "0", "--quiet",
        single)
    _, ids = read_shard(os.path.join(single_out, "train_000000.bin"))
    want = hf.encode(TEXT * 6, add_special_tokens=True).ids
    if ids != want:
        fail(f"{name}: one document's shard {ids[:8]}... is not encode(text, "
             f"add_special_tokens=True) {want[:8]}...")
    common = ["eval", "--model", d, "--fresh-init", "--seq-len", "16", "--batch", "4",
              "--threads", "1"]
    out_text, _ = run(mammoth, *common, "--text", single)
    out_tok, _ = run(mammoth, *common, "--tokens", os.path.join(single_out, "train_000000.bin"))
    r_text, r_tok = json.loads(out_text), json.loads(out_tok)
    if r_text["tokens"] != (len(want) // 16) * 15:
        fail(f"{name} eval --text: {r_text['tokens']} predictions, expected "
             f"{(len(want) // 16) * 15}")
    if r_text["loss"] != r_tok["loss"] or not math.isfinite(r_text["loss"]):
        fail(f"{name} eval --text loss {r_text['loss']} != eval --tokens {r_tok['loss']}")
    if abs(r_text["perplexity"] - math.exp(r_text["loss"])) > 1e-9 * r_text["perplexity"]:
        fail(f"{name} eval --text: perplexity {r_text['perplexity']} is not exp(loss)")
    print(f"{name} eval --text: loss {r_text['loss']:.4f} over {r_text['tokens']} predictions, "
          "as eval --tokens on the same ids")


def main():
    sys.stdout.reconfigure(line_buffering=True)  # progress shows even if the test is killed
    if len(sys.argv) != 2:
        sys.exit("usage: text_commands_test.py PATH/TO/mammoth")
    mammoth = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HOME"] = tmp
        docs = ("First document about the fox.<|endoftext|>Second one: 東京 😀 and "
                "<|end_of_text|> inside.<|endoftext|><|endoftext|>Third, after an empty one.")
        for name, make in (("llama3", llama3_tokenizer), ("llama2", llama2_tokenizer)):
            d, hf = model_dir(tmp, name, *make())
            check_generate(mammoth, name, d, hf)
            check_data_and_eval(mammoth, tmp, name, d, hf, docs, 2)

        d, hf = model_dir(tmp, "wide", *wide_tokenizer())
        if hf.get_vocab_size(with_added_tokens=True) != WIDE_VOCAB:
            fail(f"the wide tokenizer has {hf.get_vocab_size(with_added_tokens=True)} ids")
        check_data_and_eval(mammoth, tmp, "wide", d, hf,
                            docs + " ÿÿ þþ 😀😀😀", 4, train=True)

        # Refusals.
        bad = os.path.join(tmp, "bad")
        os.makedirs(bad)
        j = json.load(open(os.path.join(tmp, "llama3", "tokenizer.json"), encoding="utf-8"))
        j["normalizer"] = {"type": "NFKC"}
        with open(os.path.join(bad, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(j, f)
        _, err = run(mammoth, "data", "--out", os.path.join(tmp, "bad_out"), "--tokenizer", bad,
                     os.path.join(tmp, "llama3_single.txt"), expect_fail=True)
        if "normalizer NFKC" not in err:
            fail(f"data --tokenizer with an NFKC normalizer: the error does not name it: {err}")
        _, err = run(mammoth, "generate", "--model", "gpt2-tiny", "--prompt", "hi",
                     expect_fail=True)
        if "--tokenizer" not in err:
            fail(f"generate --prompt on a registered model: no hint to pass --tokenizer: {err}")
        print("refused: an NFKC normalizer (named), text without a tokenizer")
    print("PASS")


if __name__ == "__main__":
    main()
