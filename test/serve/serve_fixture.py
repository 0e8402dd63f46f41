"""Shared by the serve tests: a tiny Hugging Face GPT-2 directory and a running `mammoth serve`.

The directory holds weights saved by transformers (GPT2LMHeadModel, random init with a wide
initializer so that greedy choices are clear-cut rather than near-ties) beside a byte-level BPE
tokenizer.json trained with `tokenizers`, so text goes through the same kind of tokenizer
GPT-2's is. `Server` starts `mammoth serve --port 0`, reads the port it printed, and stops it
with SIGTERM, checking that it exits cleanly.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

WORDS = ("the of and to in is was for on that with as by at from it his an were are which "
         "this be or has had not but first one their its new after who they two").split()

# ChatML, as Qwen2's directories have it (rendered by transformers' apply_chat_template).
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
                 "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def make_model_dir(path, n_positions=128, seed=0, family="gpt2", n_head=2, n_embd=32):
    """A tiny HF directory: GPT-2 (n_head heads), or LLaMA with 4 query heads sharing one
    key/value head (grouped-query attention; under tp 2 each rank holds a copy of it), or the
    same as Mistral with a sliding window of 4 (shorter than a prompt)."""
    try:
        import torch
        import transformers
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError as e:
        fail(f"Python packages torch/transformers/tokenizers are not importable by "
             f"{sys.executable} ({e})")
    os.makedirs(path, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    lines = [" ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(12)) + f" {i}."
             for i in range(300)]
    tok.train_from_iterator(lines, trainer=trainer)
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast",
                   "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                   "chat_template": CHAT_TEMPLATE}, f)
    torch.manual_seed(seed)
    if family in ("llama", "mistral"):
        mistral = family == "mistral"
        kw = dict(vocab_size=tok.get_vocab_size(), hidden_size=n_embd,
                  intermediate_size=2 * n_embd, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=1, max_position_embeddings=n_positions,
                  initializer_range=0.3, bos_token_id=0, eos_token_id=0)
        if mistral:
            cfg = transformers.MistralConfig(sliding_window=4, **kw)
            model = transformers.MistralForCausalLM(cfg).eval()
        else:
            cfg = transformers.LlamaConfig(**kw)
            model = transformers.LlamaForCausalLM(cfg).eval()
    else:
        cfg = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=n_positions,
                                      n_embd=n_embd, n_layer=2, n_head=n_head,
                                      initializer_range=0.3, bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(path, safe_serialization=True)
    return path


class Server:
    """launcher: a command to run serve under (mpirun.sh -np N); SIGTERM then goes to the
    serving process (rank 0, whose pid the listening line gives), which ends every rank."""

    def __init__(self, mammoth, model_dir, *flags, launcher=()):
        self.proc = subprocess.Popen([*launcher, mammoth, "serve", "--model", model_dir,
                                      "--port", "0", *flags], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        while launcher and line.startswith("[mpirun.sh]"):
            line = self.proc.stdout.readline()
        m = re.search(r"listening on (http://[\d.]+:(\d+)).*pid (\d+)", line)
        if not m:
            self.proc.kill()
            fail(f"mammoth serve did not print its port: {line!r} {self.proc.stderr.read()}")
        self.url = m.group(1)
        self.pid = int(m.group(3))
        self.model = os.path.basename(model_dir.rstrip("/"))

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=60) as r:
            return r.status, r.read().decode()

    def post(self, path, body, raw=None):
        data = raw if raw is not None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metrics(self):
        _, text = self.get("/metrics")
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_pool_empty(self, timeout=10):
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            if m["mammoth_kv_blocks_used"] == 0 and m["mammoth_running_sequences"] == 0:
                return m
            if time.time() > deadline:
                fail(f"KV pool not empty after the requests: {m}")
            time.sleep(0.05)

    def stop(self):
        os.kill(self.pid, signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail("mammoth serve did not exit within 30 s of SIGTERM")
        err = self.proc.stderr.read()
        if rc != 0:
            fail(f"mammoth serve exited {rc} after SIGTERM: {err}")
        return err


def generate(mammoth, model_dir, prompt=None, tokens=None, max_new=16, extra=()):
    """`mammoth generate` alone: (new token ids, text)."""
    args = [mammoth, "generate", "--model", model_dir, "--max-new-tokens", str(max_new),
            "--temperature", "0", *extra]
    args += ["--prompt", prompt] if prompt is not None else [
        "--prompt-tokens", ",".join(map(str, tokens))]
    res = subprocess.run(args, capture_output=True, text=True)
    if res.returncode != 0:
        fail(f"mammoth generate exited {res.returncode}: {res.stderr}")
    if prompt is not None:
        line = json.loads(res.stderr.strip().splitlines()[-1])
        return line["tokens"], line["text"]
    return json.loads(res.stdout)["tokens"], None
