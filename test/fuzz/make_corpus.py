#!/usr/bin/env python3
"""Writes the seed corpora in test/fuzz/corpus/<target>/: small valid files and edge cases.

Run from the repository root: python3 test/fuzz/make_corpus.py (deterministic; the output is
committed, so this only needs rerunning when a format or a seed changes).
"""
import json
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors
def st(header, data=b"", pad=True):
    h = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


put("safetensors", "empty", st({}))
put("safetensors", "f32_2x3", st({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}},
                                 bytes(range(24))))
put("safetensors", "meta_two", st({"__metadata__": {"format": "pt"},
                                   "a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                                   "b": {"dtype": "I64", "shape": [], "data_offsets": [4, 12]}},
                                  bytes(12)))
put("safetensors", "zero_size", st({"z": {"dtype": "F16", "shape": [0, 4], "data_offsets": [0, 0]},
                                    "u": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]}},
                                   b"abc"))
put("safetensors", "meta_null", st({"__metadata__": None}))
put("safetensors", "gap", st({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},
                             bytes(8)))
put("safetensors", "huge_shape", st({"x": {"dtype": "F64", "shape": [4294967296, 4294967296],
                                           "data_offsets": [0, 0]}}))
put("safetensors", "short_len", b"\x10\x00\x00")

# ---- json (configs, tokenizer files, checkpoint index/manifest/state)
put("json", "config", json.dumps({"n_layer": 12, "n_head": 12, "n_embd": 768, "dropout": 0.1,
                                  "vocab_size": 50257, "bias": True, "act": "gelu_new",
                                  "layer_norm_epsilon": 1e-05, "tie": None}, indent=2))
put("json", "index", json.dumps({"format": "mammoth-sharded-checkpoint-1",
                                 "layout": {"dp": 2, "zero": 1},
                                 "tensors": {"wte.weight": {"dtype": "f32", "shape": [50257, 768]},
                                             "h.0.ln_1.bias": {"dtype": "bf16", "shape": [768]}},
                                 "shards": ["shard_00000.safetensors", "shard_00001.safetensors"]},
                                indent=2))
put("json", "manifest", json.dumps({"step": 100, "files": {
    "model.safetensors": {"bytes": 497759232, "crc32c": 3735928559},
    "state.json": {"bytes": 412, "crc32c": 1}}}))
put("json", "state", json.dumps({"step": 100, "tokens": 409600, "rng": [1, 2, 3, 4],
                                 "loss_scale": 65536.0, "lr": 6e-4, "data": {"pos": -1}}))
put("json", "strings", '["a\\u00e9\\ud83d\\ude00\\n\\t\\"\\\\\\/", "\u00e9\u4e2d\U0001F600", ""]')
put("json", "numbers", "[0, -0, 1.5, -2.25e-3, 1E+2, 9223372036854775807, -9223372036854775808,"
                       " 9223372036854775808, 1e308, 5e-324, 123456789012345678901234567890]")
put("json", "nested", "[" * 40 + "{}" + "]" * 40)
put("json", "big_object", json.dumps({f"k{i}": i for i in range(20)}))
put("json", "literals", ' {"t": true, "f": false, "n": null, "e": [], "o": {}} ')

# ---- token_shard
def shard(tokens, count=None, magic=20240520, version=1):
    h = [0] * 256
    h[0], h[1], h[2] = magic, version, len(tokens) if count is None else count
    return struct.pack("<256i", *h) + struct.pack(f"<{len(tokens)}H", *tokens)


put("token_shard", "ten", shard([50256, 15496, 995, 0, 1, 2, 3, 65535, 7, 8]))
put("token_shard", "empty", shard([]))
put("token_shard", "truncated", shard([1, 2, 3], count=4))
put("token_shard", "bad_version", shard([1], version=2))

# ---- indexed_dataset: u16 bin size, then .idx, then .bin
def indexed(seqs, docs, code=8, item=2, fmt="H"):
    binb = b""
    ptrs = []
    for s in seqs:
        ptrs.append(len(binb))
        binb += struct.pack(f"<{len(s)}{fmt}", *s)
    idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(seqs), len(docs))
    idx += struct.pack(f"<{len(seqs)}i", *[len(s) for s in seqs])
    idx += struct.pack(f"<{len(seqs)}q", *ptrs)
    idx += struct.pack(f"<{len(docs)}q", *docs)
    return struct.pack("<H", len(binb)) + idx + binb


put("indexed_dataset", "u16_three", indexed([[1, 2, 3], [4], [5, 6]], [0, 2, 3]))
put("indexed_dataset", "i32", indexed([[-1, 70000]], [0, 1], code=4, item=4, fmt="i"))
put("indexed_dataset", "i64", indexed([[1 << 40, 2]], [0, 1], code=5, item=8, fmt="q"))
put("indexed_dataset", "u8_empty_seq", indexed([[], [255]], [0, 1, 2], code=1, item=1, fmt="B"))
put("indexed_dataset", "f32", indexed([[1.5]], [0, 1], code=7, item=4, fmt="f"))
put("indexed_dataset", "no_sequences", indexed([], [0]))
# A sequence pointer near INT64_MAX: ptr + len overflowed and wrapped into the file (fixed).
put("indexed_dataset", "ptr_overflow",
    struct.pack("<H", 4) + b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 1, 1, 2)
    + struct.pack("<iq2q", 1, (1 << 63) - 1, 0, 1) + b"abcd")

# ---- image_shard
def images(labels, c, h, w, k, pixels=None):
    hd = [0] * 256
    hd[:7] = [20241130, 1, len(labels), c, h, w, k]
    n = len(labels) * c * h * w
    px = bytes((i * 37) % 256 for i in range(n)) if pixels is None else pixels
    return struct.pack("<256i", *hd) + struct.pack(f"<{len(labels)}i", *labels) + px


put("image_shard", "two_rgb_2x2", images([0, 2], 3, 2, 2, 3))
put("image_shard", "gray_4x4", images([1], 1, 4, 4, 2))
put("image_shard", "empty", images([], 1, 1, 1, 1))
put("image_shard", "bad_label", images([5], 1, 1, 1, 2))
# An image whose 2^22 x 2^21 x 2^21 pixels wrapped to 0 bytes (fixed).
put("image_shard", "size_wrap", images([0], 1 << 22, 1 << 21, 1 << 21, 2, pixels=b""))

# ---- bpe: vocab.json "\n--merges--\n" merges.txt "\n--text--\n" text
def byte_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


ALPHA = byte_alphabet()


def bpe(merges, text, extra=()):
    vocab = {ALPHA[b]: b for b in range(256)}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    for e in extra:
        vocab.setdefault(e, len(vocab))
    m = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    return (json.dumps(vocab, ensure_ascii=False) + "\n--merges--\n" + m + "\n--text--\n" + text)


put("bpe", "hello", bpe([("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("\u0120", "w"),
                         ("\u0120w", "o")], "hello world, Hello wo! 123 it's\n\n  x",
                        extra=["<|endoftext|>"]))
put("bpe", "bytes_only", bpe([], "caf\u00e9 \U0001F600 \t\r\n"))
put("bpe", "no_text", bpe([("a", "b")], "")[: -len("\n--text--\n")])

# ---- tokenizer: tokenizer.json "\n--text--\n" text
def tokenizer_json(pre, normalizer=None, merges=(), byte_fallback=False, extra_vocab=()):
    if pre is None:
        vocab = {c: i for i, c in enumerate("\u2581abcdehlorw")}
    else:
        vocab = {ALPHA[b]: b for b in range(256)}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    for e in extra_vocab:
        vocab.setdefault(e, len(vocab))
    n = len(vocab)
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": n, "content": "<s>", "single_word": False, "lstrip": False,
                          "rstrip": True, "normalized": False, "special": True}],
        "normalizer": normalizer, "pre_tokenizer": pre,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [n],
                                                                  "tokens": ["<s>"]}}},
        "decoder": {"type": "ByteLevel"} if pre else {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": None if pre else "a",
                  "fuse_unk": True, "byte_fallback": byte_fallback, "ignore_merges": True,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }, ensure_ascii=False)


LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEXT = "Hello world! It's 12345 caf\u00e9 e\u0301 \uac00\u11a8 \U0001F600<s> <s>x\n\n  y"
put("tokenizer", "byte_level", tokenizer_json(
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    merges=[("h", "e"), ("l", "l")]) + "\n--text--\n" + TEXT)
put("tokenizer", "llama3_nfc", tokenizer_json(
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]},
    normalizer={"type": "NFC"}, merges=[("l", "l")]) + "\n--text--\n" + TEXT)
put("tokenizer", "sentencepiece", tokenizer_json(
    None, normalizer={"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    merges=[("h", "e"), ("l", "l")], byte_fallback=True,
    extra_vocab=[f"<0x{b:02X}>" for b in range(256)]) + "\n--text--\n" + TEXT)


# ---- checkpoint: manifest "\n--next--\n" state "\n--next--\n" index "\n--next--\n" blob 0
# "\n--next--\n" blob 1 (an empty manifest: the fuzz target writes a truthful one; an empty
# index: the single-process form). Made from real checkpoints of a 1-layer, 4-wide GPT-2 that
# `mammoth train --save-dir` writes (one process, and 2 ranks under ZeRO-1 for the sharded
# form), so only when a mammoth binary is given: --mammoth PATH [--mpirun test/testing/mpirun.sh].
def checkpoint_seeds(mammoth, mpirun):
    import subprocess
    import tempfile

    work = tempfile.mkdtemp(prefix="mammoth_ckpt_corpus.")
    env = dict(os.environ, HOME=os.path.join(work, "home"))
    with open(os.path.join(work, "t.txt"), "w") as f:
        f.writelines(f"the cat sat on the mat and the dog ran to the cat {i}\n" for i in range(300))
    os.makedirs(os.path.join(work, "tiny"))
    with open(os.path.join(work, "tiny", "config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 4,
                   "n_layer": 1, "n_head": 1, "n_positions": 8, "n_ctx": 8, "vocab_size": 257,
                   "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
                   "tie_word_embeddings": True}, f)
    run = lambda *a: subprocess.run(list(a), cwd=work, env=env, check=True,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run(mammoth, "data", "--out", "tok", "--vocab-size", "257", "--quiet", "t.txt")
    train = ["train", "--data", "tok", "--steps", "1", "--seq-len", "8", "--micro-batch", "1",
             "--log-every", "1", "--eval-every", "0", "--threads", "1", "--warmup", "1",
             "--model", "tiny", "--fresh-init", "--save-every", "1"]
    run(mammoth, *train, "--save-dir", "single")
    run("bash", mpirun, "-np", "2", mammoth, *train, "--zero", "1", "--save-dir", "sharded")

    def read(d, f):
        with open(os.path.join(work, d, "step_00000001", f), "rb") as fh:
            return fh.read()

    sep = b"\n--next--\n"
    single = [read("single", f) for f in ("manifest.json", "state.json")] + [b""] + \
        [read("single", f) for f in ("model.safetensors", "optimizer.safetensors")]
    sharded = [read("sharded", f) for f in ("manifest.json", "state.json", "index.json",
                                            "shard_00000.safetensors",
                                            "shard_00001.safetensors")]
    put("checkpoint", "single", sep.join([b""] + single[1:]))
    put("checkpoint", "single_manifest", sep.join(single))
    put("checkpoint", "sharded", sep.join([b""] + sharded[1:]))
    put("checkpoint", "sharded_manifest", sep.join(sharded))
    index = json.loads(sharded[2])

    def sharded_with(change):
        i = json.loads(json.dumps(index))
        change(i)
        return sep.join([b"", sharded[1], json.dumps(i).encode()] + sharded[3:])

    # Hostile indexes behind a truthful manifest: shapes whose product wraps or is negative,
    # a shard list naming files outside the checkpoint or more shards than exist.
    put("checkpoint", "shape_wrap", sharded_with(
        lambda i: i["tensors"].__setitem__("wpe.weight", {"dtype": "f32",
                                                          "shape": [1 << 32, 1 << 32, 32]})))
    put("checkpoint", "shape_negative", sharded_with(
        lambda i: i["tensors"]["wpe.weight"].__setitem__("shape", [-8, -4])))
    put("checkpoint", "shard_outside", sharded_with(
        lambda i: i.__setitem__("shards", ["../ckpt/shard_00000.safetensors",
                                           "shard_00001.safetensors"])))
    put("checkpoint", "shard_repeated", sharded_with(
        lambda i: i.__setitem__("shards", i["shards"] + i["shards"])))
    put("checkpoint", "dtype_unknown", sharded_with(
        lambda i: i["tensors"]["wpe.weight"].__setitem__("dtype", "f8")))

    # A piece whose offset is near INT64_MAX: offset + size wrapped in the coverage check.
    def rename_first_piece(blob, offset):
        n = struct.unpack("<Q", blob[:8])[0]
        header = json.loads(blob[8:8 + n])
        key = next(k for k in header if k != "__metadata__")
        header[key.rsplit("@", 1)[0] + "@" + str(offset)] = header.pop(key)
        return st(header, blob[8 + n:])

    put("checkpoint", "piece_offset_wrap", sep.join(
        [b"", sharded[1], sharded[2], rename_first_piece(sharded[3], (1 << 63) - 1), sharded[4]]))
    subprocess.run(["rm", "-rf", work], check=True)


# ---- request (serve/request.h): byte 0 picks the endpoint (even: completions, odd: chat)
def request(chat, body):
    return (b"\x01" if chat else b"\x00") + (body if isinstance(body, bytes) else
                                             json.dumps(body).encode())


put("request", "completion_text", request(False, {"model": "tiny", "prompt": "the of and",
                                                  "max_tokens": 8, "temperature": 0}))
put("request", "completion_ids", request(False, {"model": "tiny", "prompt": [[1, 2, 399]],
                                                 "stop": ["\n", "."], "seed": 7, "top_k": 5,
                                                 "top_p": 0.9}))
put("request", "completion_stream", request(False, {
    "model": "tiny", "prompt": ["one"], "stream": True, "stream_options": {"include_usage": True},
    "n": 1, "presence_penalty": 0, "logit_bias": {}, "user": "u", "best_of": 1}))
put("request", "completion_nulls", request(False, {"model": "tiny", "prompt": "x",
                                                   "max_tokens": None, "stop": None,
                                                   "seed": None, "suffix": None}))
put("request", "chat", request(True, {"model": "tiny", "messages": [
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    "max_completion_tokens": 4, "stream": True}))
put("request", "chat_bad_content", request(True, {"model": "tiny", "messages": [
    {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}))
put("request", "bad_json", request(False, b'{"model": "tiny", "prompt": '))
put("request", "wrong_model", request(True, {"model": "gpt-4", "messages": []}))
put("request", "bad_values", request(False, {"model": "tiny", "prompt": "x", "max_tokens": -1,
                                             "temperature": 3, "top_p": 0, "stop": [""] * 5}))


# ---- wordpiece: vocab.txt ["\n--config--\n" tokenizer_config.json] ["\n--text--\n" text]
WP_VOCAB = "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "caf", "##e", "σας",
                       "中", "!", "##s", "play", "##ing"]).encode()
put("wordpiece", "multilingual", WP_VOCAB + "\n--text--\nThe CAFÉ! ΣΑΣ 中文 playing [SEP] x\u2028y "
    "\u00a0e\u0301 \U0001F600\x01".encode())
put("wordpiece", "config", WP_VOCAB + b'\n--config--\n{"do_lower_case": false, "strip_accents": '
    b'true, "tokenize_chinese_chars": false}\n--text--\nCaf\xc3\xa9 plays')
put("wordpiece", "invalid_utf8", WP_VOCAB + b"\n--text--\ncaf\xe9 \xff\xfe")
put("wordpiece", "no_text", WP_VOCAB)


if "--mammoth" in sys.argv:
    mpirun = sys.argv[sys.argv.index("--mpirun") + 1] if "--mpirun" in sys.argv else \
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing", "mpirun.sh")
    checkpoint_seeds(os.path.abspath(sys.argv[sys.argv.index("--mammoth") + 1]), mpirun)
