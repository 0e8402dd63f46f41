// `mammoth bench train`: tokens/s of Mammoth's CPU training step next to PyTorch's CPU step
// (eager, and torch.compile where the anchor's torch has it) on the same GPT-2, batch and
// thread count, measured in alternating rounds of the same run.
//
//   mammoth bench train [--models gpt2-tiny,gpt2] [--batch 4] [--seq 64] [--threads N]
//                       [--amp fp32,bf16] [--steps 5] [--warmup 2] [--rounds 3] [--json FILE]
//                       [--python PATH] [--torch-script PATH] [--no-torch] [--no-compile]
//
// A step is forward, cross-entropy, backward, AdamW update and zero_grad on random token ids
// (the data pipeline is not timed on either side). Each round times --steps steps of ours, then
// of the anchor eager, then compiled (one PyTorch process per row, so it compiles once); a
// round's figure is its median step, the row's the median of its rounds: the machine's speed
// drifts, and only rounds that alternate compare like with like.
//
// The anchor is tools/bench/train/train_bench.py run by --python, else $MAMMOTH_ANCHOR_PYTHON,
// else the PyTorch 2.x venv `bash tools/setup.sh --bench-anchor` makes
// (~/.cache/mammoth/venv-torch2/bin/python-anchor), else -- labelled FALLBACK -- $MAMMOTH_PYTHON
// or /usr/bin/python3 (Debian's torch 1.13: eager only). Its thread count is ours; it prints its
// torch version, ATen CPU capability, inductor ISA and BLAS. When our kernels run AVX2 on an
// AVX-512 CPU (MAMMOTH_ISA=avx2) the anchor is capped at AVX2 too (tools/bench/anchor_isa.h).
// --json writes one object per row:
//   {"name": "train_gpt2_fp32", "shape": "B4 T64", "threads": 2, "rounds": 3, "ours": 310.2,
//    "anchor": 145.1, "unit": "tokens/s", "ratio": 2.14, "ours_ms": ..., "anchor_ms": ...,
//    "anchor_compiled_ms": ..., "ratio_compiled": ..., "anchor_torch": "2.15.0", ...}
// ("anchor" and "ratio" are the eager anchor's).
#pragma once

#include <string>
#include <vector>

namespace mammoth::tools {

// args: the flags above (after "bench train"). Returns a process exit code.
int run_train_bench(const std::vector<std::string>& args);

}  // namespace mammoth::tools
