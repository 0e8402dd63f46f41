// What fits where: for a model, a plan and a device and host of given sizes, what each offload
// setting of `mammoth train` needs per rank and tier, whether it fits, and the deepest model of
// the same width (n_layer varied) that would. `mammoth analyze` prints it. Every byte comes
// from plan::predict_memory (the model checked against the allocator), so the table and the
// planner cannot disagree.
//
// The settings, as train's flags give them on top of the base plan:
//   none        --offload none                    everything in the allocator on the device
//   host        --offload host                    AdamW states in host memory (CPU AdamW)
//   nvme        --offload nvme                    AdamW states on NVMe, staged through the host
//   host-paged  --offload none --device-mem auto:D  every chunk homed on the host, cached on
//                                                 the device in what the allocator's peak
//                                                 leaves of D
//   nvme-paged  --offload nvme --device-mem auto:D  parameters and gradients homed on the host,
//                                                 states on NVMe, cached the same way
// Device need: the allocator's peak plus the chunks the device holds (paged: plus the margin
// auto:D keeps, and at least one chunk per list computed there). A budget of 0 is
// unlimited (NVMe always is). The bytes are per rank, for the worst pipeline stage per tier.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/json.h"
#include "models/config.h"
#include "plan/parallel_plan.h"

namespace mammoth::plan {

struct OffloadFit {
  std::string setting;
  ParallelPlan plan;    // the base plan with this setting's offload fields
  std::string invalid;  // plan::check's message when the setting cannot run this plan
  int64_t device_bytes = 0;
  int64_t host_bytes = 0;
  int64_t nvme_bytes = 0;
  bool fits = false;
  // The deepest model of this family and width (n_layer varied) that fits; 0 when none does.
  int64_t max_layers = 0;
  int64_t max_params = 0;
};

// `base` gives everything but the offload fields (its offload, device_mem, auto_device_mem and
// host_mem are replaced per setting; host_mem takes `host_mem`).
std::vector<OffloadFit> offload_fits(const models::ModelConfig& config, const ParallelPlan& base,
                                     int64_t device_mem, int64_t host_mem);
json::Value offload_fits_to_json(const std::vector<OffloadFit>& fits, int64_t device_mem,
                                 int64_t host_mem);

}  // namespace mammoth::plan
