// `mammoth bench offload`: training step time of a model whose parameters + gradients + AdamW
// states are 4x the device budget (chunked offload, engine/offload) beside the same model with
// no budget, in the same run, as a ratio (in-memory step time / offloaded step time; the
// target is >= 0.6 on the CPU backend: the moves must hide behind compute).
//
//   mammoth bench offload [--model gpt2-tiny] [--steps 8] [--micro-batch 8] [--grad-accum 1]
//       [--seq-len 64]
//       [--modes none,host,nvme,all_nvme[@FRACTION]] [--budget-fraction 0.25] [--chunk-mb 0.5]
//       [--nvme-dir DIR] [--host-mem 0] [--io-size 256M] [--threads 0] [--rounds 3]
//       [--no-anchor] [--json FILE]
// Each mode is one row: --offload=MODE with --device-mem = budget-fraction x the model state
// (and --host-mem as given). All runs train on the embedded corpus. Step time is the median over
// the steps after the first (the first records the access trace). Every row also checks that
// the losses equal the in-memory run's bitwise. A model whose state exceeds 90% of the machine's
// RAM (gpt2-xl's 23 GiB on a 24 GiB machine) has no in-memory run: its rows report no ratio
// and check instead that the loss falls ("loss_falls" in place of "identical"); --no-anchor
// asks for that of any model.
// --json FILE writes a JSON array, one object per row:
//   {"name": "offload_host", "shape": "gpt2-tiny 8x64", "ours": 0.061, "anchor": 0.052,
//    "unit": "s/step", "ratio": 0.85, "device_mem": ..., "model_state": ..., "identical": true}
#pragma once

#include <string>
#include <vector>

namespace mammoth::tools {

int run_offload_bench(const std::vector<std::string>& args);

}  // namespace mammoth::tools
