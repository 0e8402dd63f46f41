#!/usr/bin/env python3
"""Instruction data end to end: `mammoth data` on JSONL against transformers, then `train`.

1. Model directories are made with `tokenizers` + transformers (a byte-level BPE trained here,
   the chat tokens as special tokens): Qwen2's ChatML template, Llama 3's, and none.
2. A generated instruction set (chat messages with and without a system prompt, multi-turn,
   and prompt/response pairs) goes through `mammoth data --tokenizer DIR --seq-len 64`.
3. The reference: transformers' apply_chat_template(..., tokenize=False) renders the prefixes
   (the generation prompt before each assistant turn, the conversation through it), HF
   tokenizes each segment, and the examples are packed by the rule instruction_data.h states.
   Our tokens and loss mask must equal it exactly, and the response tokens must decode to the
   assistant contents and the template's end-of-turn text.
4. `mammoth train --model llama-tiny --data DIR` learns: the (response-only) loss falls; the
   batches it is fed (--dump-batches) have -100 exactly at targets that are not response
   tokens; `--data FILE.jsonl` tokenizes the same sequences itself (the same first loss); and
   --loss-on all counts the prompts too (a different loss).
Malformed examples are refused naming the line.

Usage: instruction_data_interop_test.py PATH/TO/mammoth
"""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testing"))
import curves  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_template_interop_test import LLAMA3, QWEN2  # noqa: E402

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

SEQ = 64
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
COLORS = ["red", "green", "blue", "black", "white", "yellow"]
THINGS = ["sky", "grass", "sun", "snow", "coal", "sea", "leaf", "cloud"]


def examples(n, seed):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        thing, color = rng.choice(THINGS), rng.choice(COLORS)
        q = f"What color is the {thing}?"
        a = f"The {thing} is {color}."
        kind = i % 4
        if kind == 0:
            out.append({"prompt": q, "response": a})
        elif kind == 1:
            out.append({"messages": [{"role": "user", "content": q},
                                     {"role": "assistant", "content": a}]})
        elif kind == 2:
            out.append({"messages": [{"role": "system", "content": "Answer briefly."},
                                     {"role": "user", "content": q},
                                     {"role": "assistant", "content": a}]})
        else:
            t2 = rng.choice(THINGS)
            out.append({"messages": [{"role": "user", "content": q},
                                     {"role": "assistant", "content": a},
                                     {"role": "user", "content": f"And the {t2}?"},
                                     {"role": "assistant", "content": f"The {t2} is {color}."}]})
    return out


def make_dir(path, template, eos):
    corpus = [f"What color is the {t}? The {t} is {c}. And the {t}? Answer briefly. "
              f"system user assistant\n" for t in THINGS for c in COLORS] * 3
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    kw = {"eos_token": eos}
    if template == LLAMA3:
        kw["bos_token"] = "<|begin_of_text|>"
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, **kw)
    if template is not None:
        hf.chat_template = template
    hf.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def reference(hf, exs, has_template):
    """Tokens and parts (0 pad, 1 prompt, 2 response), packed as instruction_data.h says."""
    pad = hf.eos_token_id
    tokens, parts = [], []
    enc = lambda text: hf(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    for ex in exs:
        t, p = [], []
        if not has_template:
            t += enc(ex["prompt"])
            p += [1] * len(t)
            r = enc(ex["response"]) + [hf.eos_token_id]
            t += r
            p += [2] * len(r)
        else:
            msgs = ex.get("messages") or [{"role": "user", "content": ex["prompt"]},
                                          {"role": "assistant", "content": ex["response"]}]
            covered = ""
            render = lambda m, g: hf.apply_chat_template(  # noqa: E731
                m, tokenize=False, add_generation_prompt=g)
            segments = []
            for i, m in enumerate(msgs):
                if m["role"] == "assistant":
                    segments += [(render(msgs[:i], True), 1), (render(msgs[:i + 1], False), 2)]
            segments.append((render(msgs, False), 1))
            for text, part in segments:
                assert text.startswith(covered)
                ids = enc(text[len(covered):])
                t += ids
                p += [part] * len(ids)
                covered = text
        t, p = t[:SEQ], p[:SEQ]
        if 2 not in p[1:]:
            continue
        if len(tokens) % SEQ + len(t) > SEQ:
            while len(tokens) % SEQ:
                tokens.append(pad)
                parts.append(0)
        tokens += t
        parts += p
    while len(tokens) % SEQ:
        tokens.append(pad)
        parts.append(0)
    return tokens + [pad], parts + [0]


def read_shard(path):
    raw = open(path, "rb").read()
    header = struct.unpack("<256i", raw[:1024])
    width = 2 if header[1] == 1 else 4
    n = header[2]
    return list(struct.unpack(f"<{n}{'H' if width == 2 else 'I'}", raw[1024:1024 + n * width]))


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        print("FAILED:", " ".join(cmd), "\n", r.stdout, r.stderr)
        sys.exit(1)
    return r


def main():
    mammoth = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as root:
        exs = examples(240, seed=5)
        jsonl = os.path.join(root, "train.jsonl")
        with open(jsonl, "w") as f:
            for ex in exs:
                f.write(json.dumps(ex) + "\n")
        pr_jsonl = os.path.join(root, "pairs.jsonl")
        with open(pr_jsonl, "w") as f:
            for ex in exs:
                if "prompt" in ex:
                    f.write(json.dumps(ex) + "\n")
        for name, template, eos in (("chatml", QWEN2, "<|im_end|>"),
                                    ("llama3", LLAMA3, "<|eot_id|>"),
                                    ("plain", None, "<|endoftext|>")):
            model = os.path.join(root, name)
            hf = make_dir(model, template, eos)
            src = jsonl if template is not None else pr_jsonl
            used = [json.loads(line) for line in open(src)]
            out = os.path.join(root, name + "_data")
            run([mammoth, "data", "--out", out, "--tokenizer", model, "--seq-len", str(SEQ), src])
            ours_t = read_shard(os.path.join(out, "train_000000.bin"))
            ours_p = read_shard(os.path.join(out, "train_000000.loss_mask"))
            ref_t, ref_p = reference(hf, used, template is not None)
            ok = ours_t == ref_t and ours_p == ref_p
            print(f"{name}: {len(ours_t)} tokens, {ours_p.count(2)} response tokens, "
                  f"equal to the transformers reference: {ok}")
            if not ok:
                first = next((i for i, (a, b) in enumerate(zip(ours_t + [None], ref_t))
                              if a != b), None)
                print("  first token difference at", first, "parts equal:", ours_p == ref_p)
                failures.append(name + " mask")
            if name == "chatml":
                # The response tokens of each sequence decode to "content<|im_end|>\n" runs.
                runs, cur = [], []
                for tok, part in zip(ours_t, ours_p):
                    if part == 2:
                        cur.append(tok)
                    elif cur:
                        runs.append(hf.decode(cur))
                        cur = []
                answers = [m["content"] for ex in used for m in ex.get("messages", [
                    {"role": "assistant", "content": ex.get("response")}]) if m["role"] == "assistant"]
                # Runs cut by truncation at seq_len are prefixes of one.
                expect = {a + "<|im_end|>\n" for a in answers}
                whole = sum(r in expect for r in runs)
                cut = [r for r in runs if r not in expect]
                print(f"  response runs: {whole} whole answers + <|im_end|>\\n, {len(cut)} cut")
                if whole < 200 or not all(any(e.startswith(r) for e in expect) for r in cut):
                    print("  response runs differ:", cut[:3])
                    failures.append("chatml response text")

        # Training on the ChatML data: the response loss falls.
        data = os.path.join(root, "chatml_data")
        common = ["--model", "llama-tiny", "--seq-len", str(SEQ), "--micro-batch", "8",
                  "--lr", "3e-3", "--warmup", "5", "--eval-every", "0", "--log-every", "10",
                  "--threads", "2", "--seed", "7"]
        metrics = os.path.join(root, "m.jsonl")
        dump = os.path.join(root, "batches.jsonl")
        r = run([mammoth, "train", "--data", data, "--steps", "80", "--metrics", metrics,
                 "--dump-batches", dump] + common)
        if "loss on response tokens (--loss-on response, the default" not in r.stderr:
            failures.append("default --loss-on not printed")
        ls = curves.losses(metrics)
        print(f"train --loss-on response: loss {ls[0]:.3f} -> {ls[-1]:.3f} over {len(ls)} steps")
        if not ls[-1] < 0.5 * ls[0]:
            failures.append("response loss did not fall by half")
        # The targets fed to the model: -100 exactly where the next token is not a response.
        chat_t = read_shard(os.path.join(data, "train_000000.bin"))
        chat_p = read_shard(os.path.join(data, "train_000000.loss_mask"))
        starts = {tuple(chat_t[w * SEQ:w * SEQ + SEQ]): w for w in range(len(chat_t) // SEQ)}
        checked = 0
        for line in open(dump):
            b = json.loads(line)
            B, T = b["shape"]
            for row in range(B):
                inp = b["input"][row * T:(row + 1) * T]
                tgt = b["target"][row * T:(row + 1) * T]
                w = starts[tuple(inp)]
                want = [chat_t[w * T + t + 1] if chat_p[w * T + t + 1] == 2 else -100
                        for t in range(T)]
                checked += 1
                if tgt != want:
                    failures.append(f"targets of window {w}")
                    break
        print(f"{checked} training rows: targets are -100 off the responses")

        # --data FILE.jsonl: tokenized by train itself, the same sequences, the same first loss.
        m2 = os.path.join(root, "m2.jsonl")
        run([mammoth, "train", "--data", jsonl, "--tokenizer", os.path.join(root, "chatml"),
             "--steps", "2", "--metrics", m2] + common)
        same = abs(curves.losses(m2)[0] - ls[0]) < 1e-6
        print(f"train --data FILE.jsonl: first loss {curves.losses(m2)[0]:.6f} (directory's "
              f"{ls[0]:.6f}): {'same' if same else 'DIFFERENT'}")
        if not same:
            failures.append("--data FILE.jsonl")
        m3 = os.path.join(root, "m3.jsonl")
        run([mammoth, "train", "--data", data, "--loss-on", "all", "--steps", "2",
             "--metrics", m3] + common)
        if abs(curves.losses(m3)[0] - ls[0]) < 1e-3:
            failures.append("--loss-on all gives the response-only loss")
        print(f"--loss-on all: first loss {curves.losses(m3)[0]:.4f}")

        # Refusals, by name.
        bad = [('{"messages": [{"role": "user", "content": "x"}]}', "no assistant message"),
               ('{"prompt": "x", "response": "y", "id": 3}', "key 'id' is not supported"),
               ('{"messages": [{"role": "tool", "content": "x"}]}', "role 'tool'"),
               ('{"messages": [{"role": "user", "content": "x", "name": "a"},'
                ' {"role": "assistant", "content": "y"}]}', "message key 'name'"),
               ('not json', ":1:")]
        for text, message in bad:
            p = os.path.join(root, "bad.jsonl")
            open(p, "w").write(text + "\n")
            r = subprocess.run([mammoth, "data", "--out", os.path.join(root, "bad"),
                                "--tokenizer", os.path.join(root, "chatml"), p],
                               capture_output=True, text=True)
            if r.returncode == 0 or message not in r.stderr:
                failures.append(f"not refused: {text} ({r.stderr.strip()})")
        r = subprocess.run([mammoth, "train", "--data", data, "--seq-len", "32", "--steps", "1",
                            "--model", "llama-tiny"], capture_output=True, text=True)
        if r.returncode == 0 or "train with --seq-len 64" not in r.stderr:
            failures.append("a different --seq-len was not refused")
    print("failures:", failures)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
