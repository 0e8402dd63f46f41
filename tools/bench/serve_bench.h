// `mammoth bench serve`: a load generator for the serving scheduler (serve/scheduler.h) next to
// Hugging Face transformers' `generate` on the same weights, prompts and lengths, same run.
//
//   mammoth bench serve [--model gpt2] [--concurrency 1,8,32] [--max-tokens 32] [--threads N]
//                       [--json FILE] [--python PATH] [--hf-script PATH] [--no-hf] [--quick]
//
// The request mix is fixed: request i has a prompt of 32 + 32 * (i % 4) pseudo-random token ids
// and asks for exactly --max-tokens greedy tokens (eos ignored, on both sides), so every run
// and both sides do the same work. At concurrency C, C clients each send the next request of
// max(4, 2C) as soon as their previous one ends (closed loop) to one Scheduler (continuous
// batching, paged KV cache), in this process, without HTTP. The anchor
// (tools/bench/serve_bench.py, run by $MAMMOTH_PYTHON) runs the same requests through
// GPT2LMHeadModel.generate in static batches of C (left padding, greedy, same thread count).
// Figures: generated tokens/s over the whole run, and p50 / p99 time to first token (from a
// request's start to its first token; for a static batch, from the batch's start). Weights are
// a random init (seed 1) of the named config, written as a Hugging Face directory for the
// anchor: this machine has no pretrained GPT-2 offline, and speed does not depend on the values.
// --json writes one object per concurrency:
//   {"name": "serve_gpt2_c8", "concurrency": 8, "ours": 190.0, "anchor": 52.1,
//    "unit": "tokens/s", "ratio": 3.6, "ttft_p50_ms": ..., "ttft_p99_ms": ..., "anchor_...": ...}
#pragma once

#include <string>
#include <vector>

namespace mammoth::tools {

// args: the flags above (after "bench serve"). Returns a process exit code.
int run_serve_bench(const std::vector<std::string>& args);

}  // namespace mammoth::tools
