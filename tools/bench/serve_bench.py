#!/ usr / bin / env python3
"""The anchor of `mammoth bench serve`: HF transformers `generate` on the same requests.

Requests (a JSON list of prompt token-id lists) run in order in static batches of
--concurrency: each batch is left-padded, generated greedily for exactly --max-tokens new tokens
(min_new_tokens = max_new_tokens, so eos does not end a row early), and the next batch starts
when it ends. Time to first token of a request is from its batch's start to the end of the
batch's first forward (a logits processor notes the time when generate first asks it). Writes
a JSON object to --out: tokens_per_s (generated tokens over the whole run), ttft_p50_ms,
ttft_p99_ms and every request's new ids.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")  # Debian's OpenBLAS on AVX2-only CPUs


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--requests", required=True)
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"serve_bench.py: torch/transformers not importable by {sys.executable} ({e})")
    torch.set_num_threads(a.threads)
    model = transformers.GPT2LMHeadModel.from_pretrained(a.model_dir).eval()
    prompts = json.load(open(a.requests))
    pad = 0  # any id: padded positions are masked out

    class FirstCall(transformers.LogitsProcessor):
        def __init__(self):
            self.at = None

        def __call__(self, input_ids, scores):
            if self.at is None:
                self.at = time.perf_counter()
            return scores

    def run_batch(batch):
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        first = FirstCall()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                 max_new_tokens=a.max_tokens, min_new_tokens=a.max_tokens,
                                 pad_token_id=pad, logits_processor=[first])
        return out[:, width:].tolist(), (first.at - start) * 1e3

    run_batch(prompts[:1])  # warm-up
    outputs, ttft = [], []
    t0 = time.perf_counter()
    for i in range(0, len(prompts), a.concurrency):
        batch = prompts[i:i + a.concurrency]
        new, first_ms = run_batch(batch)
        outputs += new
        ttft += [first_ms] * len(batch)
    wall = time.perf_counter() - t0
    tokens = sum(len(o) for o in outputs)
    with open(a.out, "w") as f:
        json.dump({"tokens_per_s": tokens / wall, "ttft_p50_ms": quantile(ttft, 0.5),
                   "ttft_p99_ms": quantile(ttft, 0.99), "outputs": outputs}, f)


if __name__ == "__main__":
    main()
