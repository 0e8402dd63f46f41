#!/usr/bin/env python3
"""Fine-tuning from a Hugging Face directory: `mammoth train --model HF_DIR --data ...`.

transformers writes a tiny LlamaForCausalLM directory (with a byte-level BPE tokenizer trained
here by `tokenizers`); `mammoth data --tokenizer DIR` tokenizes a text with it. Then:
  - train starts from the directory's weights: its first-step loss equals transformers' loss
    on the very batch it trained on (--dump-batches), and the vocabulary stays the directory's;
  - without --data it keeps the directory's vocabulary too (the embedded corpus tokenized with
    the directory's tokenizer);
  - `ckpt export --dtype bf16` writes bf16 weights (torch_dtype bfloat16) transformers loads;
  - `mammoth ckpt export --max-shard-mb` writes transformers' sharded form (shards + index)
    with the tokenizer beside it, which AutoModelForCausalLM / AutoTokenizer load; trained at
    lr 0 the weights come back bitwise, and trained at lr > 0 transformers reproduces the
    loss Mammoth's evaluation of the export gives.

Usage: hf_finetune_test.py PATH/TO/mammoth
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import curves  # noqa: E402

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SEQ, BATCH = 32, 4


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print("FAILED:", " ".join(cmd), "\n", r.stdout[-3000:], r.stderr[-3000:])
        sys.exit(1)
    return r


def make_model_dir(path, text):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                                  eos_token="<|endoftext|>")
    hf_tok.save_pretrained(path)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(hf_tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rope_theta=10000.0, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # weights large enough that the loss depends on them
        for p in model.parameters():
            p.normal_(0, 0.15)
    model.save_pretrained(path, safe_serialization=True)
    return model


def hf_loss(model, rows):
    ids = torch.tensor([r[0] for r in rows])
    targets = torch.tensor([r[1] for r in rows])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.double()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1), ignore_index=-100).item()


def batch_rows(dump):
    rows = []
    for line in open(dump):
        b = json.loads(line)
        B, T = b["shape"]
        rows += [(b["input"][i * T:(i + 1) * T], b["target"][i * T:(i + 1) * T]) for i in range(B)]
    return rows


def main():
    mammoth = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as root:
        text = " ".join(f"the {a} {b} jumps over the lazy {c}."
                        for a in ("quick", "slow", "red", "tall") for b in ("fox", "dog", "cat")
                        for c in ("dog", "mouse", "fox", "owl")) * 6
        src = os.path.join(root, "hf")
        ref = make_model_dir(src, text)
        vocab = ref.config.vocab_size
        corpus = os.path.join(root, "corpus.txt")
        open(corpus, "w").write(text)
        shards = os.path.join(root, "shards")
        run([mammoth, "data", "--out", shards, "--tokenizer", src, "--val-fraction", "0.1",
             corpus])
        common = ["--model", src, "--seq-len", str(SEQ), "--micro-batch", str(BATCH),
                  "--eval-every", "0", "--threads", "2", "--warmup", "0", "--log-every", "1"]

        # 1. The first step's loss is transformers' loss on that batch; lr 0 keeps the weights.
        m0, d0, s0 = (os.path.join(root, n) for n in ("m0.jsonl", "b0.jsonl", "save0"))
        r = run([mammoth, "train", "--data", os.path.join(shards, "train_*.bin"), "--steps", "1",
                 "--lr", "0", "--metrics", m0, "--dump-batches", d0, "--save-dir", s0] + common)
        ours, theirs = curves.losses(m0)[0], hf_loss(ref, batch_rows(d0))
        rel = abs(ours - theirs) / abs(theirs)
        print(f"first-step loss: mammoth {ours:.6f}, transformers {theirs:.6f} (rel {rel:.1e})")
        if rel > 1e-5:
            failures.append("first-step loss")
        if f"{vocab}" not in r.stderr and "weights:" not in r.stderr:
            failures.append("weights source not reported")

        # 2. Export: sharded with its index and the tokenizer; transformers loads it bitwise.
        e0 = os.path.join(root, "export0")
        run([mammoth, "ckpt", "export", s0, "--out", e0, "--max-shard-mb", "0.1"])
        files = sorted(os.listdir(e0))
        shards_out = [f for f in files if f.startswith("model-") and f.endswith(".safetensors")]
        index = json.load(open(os.path.join(e0, "model.safetensors.index.json")))
        print(f"export: {len(shards_out)} shards, index of {len(index['weight_map'])} tensors, "
              f"files {files}")
        if len(shards_out) < 2 or "model.safetensors" in files or "tokenizer.json" not in files:
            failures.append("sharded export layout")
        if set(index["weight_map"].values()) != set(shards_out):
            failures.append("index names other files than the shards")
        back = transformers.AutoModelForCausalLM.from_pretrained(e0)
        transformers.AutoTokenizer.from_pretrained(e0)
        if back.config.vocab_size != vocab:
            failures.append("vocabulary changed")
        sd, rsd = back.state_dict(), ref.state_dict()
        diff = [k for k in rsd if "rotary" not in k and not torch.equal(sd[k], rsd[k])]
        print(f"lr 0 export equals the source weights: {not diff}")
        if diff:
            failures.append(f"exported weights differ: {diff[:3]}")

        # bf16 asked for: bf16 files, torch_dtype bfloat16, the source weights rounded to bf16.
        eb = os.path.join(root, "export_bf16")
        run([mammoth, "ckpt", "export", s0, "--out", eb, "--dtype", "bf16"])
        cfg_b = json.load(open(os.path.join(eb, "config.json")))
        half = transformers.AutoModelForCausalLM.from_pretrained(eb, torch_dtype="auto")
        hsd = half.state_dict()
        bf16_ok = (cfg_b.get("torch_dtype") == "bfloat16" and
                   all(hsd[k].dtype == torch.bfloat16 and torch.equal(hsd[k], rsd[k].bfloat16())
                       for k in rsd if "rotary" not in k))
        print(f"--dtype bf16 export: torch_dtype {cfg_b.get('torch_dtype')}, weights the source's "
              f"rounded to bf16: {bf16_ok}")
        if not bf16_ok:
            failures.append("bf16 export")

        # 3. Real fine-tuning: the loss falls, and the export's loss in transformers equals
        # Mammoth's evaluation of the export on the same batch.
        m1, s1, e1 = (os.path.join(root, n) for n in ("m1.jsonl", "save1", "export1"))
        run([mammoth, "train", "--data", os.path.join(shards, "train_*.bin"), "--steps", "30",
             "--lr", "3e-3", "--metrics", m1, "--save-dir", s1] + common)
        ls = curves.losses(m1)
        print(f"fine-tuning loss {ls[0]:.3f} -> {ls[-1]:.3f}")
        if not ls[-1] < ls[0]:
            failures.append("fine-tuning loss did not fall")
        run([mammoth, "ckpt", "export", s1, "--out", e1, "--max-shard-mb", "0.1"])
        tuned = transformers.AutoModelForCausalLM.from_pretrained(e1)
        m2, d2 = os.path.join(root, "m2.jsonl"), os.path.join(root, "b2.jsonl")
        run([mammoth, "train", "--data", os.path.join(shards, "train_*.bin"), "--steps", "1",
             "--lr", "0", "--metrics", m2, "--dump-batches", d2] + common[:1] + [e1] + common[2:])
        ours, theirs = curves.losses(m2)[0], hf_loss(tuned, batch_rows(d2))
        print(f"export of the tuned model: mammoth {ours:.6f}, transformers {theirs:.6f}")
        if abs(ours - theirs) / abs(theirs) > 1e-5:
            failures.append("tuned export loss")

        # 4. No --data: the directory's vocabulary is kept.
        m3, s3, e3 = (os.path.join(root, n) for n in ("m3.jsonl", "save3", "export3"))
        r = run([mammoth, "train", "--steps", "1", "--metrics", m3, "--save-dir", s3] + common)
        run([mammoth, "ckpt", "export", s3, "--out", e3])
        v3 = json.load(open(os.path.join(e3, "config.json")))["vocab_size"]
        print(f"without --data: vocabulary {v3} (directory's {vocab}); {r.stderr.splitlines()[0]}")
        if v3 != vocab or "tokenized with" not in r.stderr:
            failures.append("vocabulary without --data")
    print("failures:", failures)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
