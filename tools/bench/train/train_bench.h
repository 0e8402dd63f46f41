// `mammoth bench train`: tokens/s of Mammoth's CPU training step next to PyTorch's eager CPU
// step on the same GPT-2, batch and thread count, measured in the same run.
//
//   mammoth bench train [--models gpt2-tiny,gpt2] [--batch 4] [--seq 64] [--threads N]
//                       [--amp fp32,bf16] [--steps 5] [--warmup 2] [--json FILE]
//                       [--python PATH] [--torch-script PATH] [--no-torch]
//
// A step is forward, cross-entropy, backward, AdamW update and zero_grad on random token ids
// (the data pipeline is not timed on either side); the figure is the median step. The anchor
// is tools/bench/train/train_bench.py run by $MAMMOTH_PYTHON (default /usr/bin/python3, Debian's
// torch) with OpenBLAS set up as the issue asks; it prints the BLAS library it mapped, and the
// table shows it. --json writes one object per row:
//   {"name": "train_gpt2_fp32", "shape": "B4 T64", "threads": 2, "ours": 310.2,
//    "anchor": 145.1, "unit": "tokens/s", "ratio": 2.14, "ours_ms": ..., "anchor_ms": ...}
#pragma once

#include <string>
#include <vector>

namespace mammoth::tools {

// args: the flags above (after "bench train"). Returns a process exit code.
int run_train_bench(const std::vector<std::string>& args);

}  // namespace mammoth::tools
