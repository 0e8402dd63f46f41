#include "tools/plan_flags.h"

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "base/error.h"
#include "memory/chunks/chunk_manager.h"

ABSL_DECLARE_FLAG(std::string, plan);
ABSL_DECLARE_FLAG(int, dp);
ABSL_DECLARE_FLAG(int, ep);
ABSL_DECLARE_FLAG(int, tp);
ABSL_DECLARE_FLAG(int, sp);
ABSL_DECLARE_FLAG(std::string, sp_mode);
ABSL_DECLARE_FLAG(int, pp);
ABSL_DECLARE_FLAG(std::string, pp_schedule);
ABSL_DECLARE_FLAG(int, virtual_stages);
ABSL_DECLARE_FLAG(std::string, pp_partition);
ABSL_DECLARE_FLAG(int64_t, micro_batch);
ABSL_DECLARE_FLAG(int64_t, grad_accum);
ABSL_DECLARE_FLAG(int64_t, seq_len);
ABSL_DECLARE_FLAG(int, zero);
ABSL_DECLARE_FLAG(double, bucket_mb);
ABSL_DECLARE_FLAG(std::string, offload);
ABSL_DECLARE_FLAG(std::string, offload_optimizer);
ABSL_DECLARE_FLAG(std::string, offload_params);
ABSL_DECLARE_FLAG(std::string, device_mem);
ABSL_DECLARE_FLAG(std::string, host_mem);
ABSL_DECLARE_FLAG(double, chunk_mb);
ABSL_DECLARE_FLAG(std::string, nvme_dir);
ABSL_DECLARE_FLAG(bool, activation_checkpointing);
ABSL_DECLARE_FLAG(int64_t, recompute_blocks);
ABSL_DECLARE_FLAG(std::string, amp);
ABSL_DECLARE_FLAG(std::string, device);

namespace mammoth::tools {
namespace {

// The flags a plan gives instead.
constexpr const char* kLayoutFlags[] = {"dp",
                                        "ep",
                                        "pp",
                                        "tp",
                                        "sp",
                                        "sp_mode",
                                        "pp_schedule",
                                        "virtual_stages",
                                        "pp_partition",
                                        "micro_batch",
                                        "grad_accum",
                                        "seq_len",
                                        "zero",
                                        "bucket_mb",
                                        "offload",
                                        "offload_optimizer",
                                        "offload_params",
                                        "device_mem",
                                        "host_mem",
                                        "chunk_mb",
                                        "nvme_dir",
                                        "activation_checkpointing",
                                        "recompute_blocks",
                                        "amp"};

}  // namespace

bool flag_changed(const char* name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  MAMMOTH_CHECK(flag != nullptr) << "[flags] no flag --" << name;
  return flag->CurrentValue() != flag->DefaultValue();
}

void refuse_layout_flags(const char* command, const std::string& source,
                         const std::set<std::string>& inputs) {
  for (const char* name : kLayoutFlags) {
    MAMMOTH_CHECK(inputs.count(name) > 0 || !flag_changed(name))
        << "[" << command << "] --" << name << " is set by --plan " << source
        << "; give the layout in one place (edit the plan file, or leave out --plan)";
  }
}

plan::ParallelPlan plan_from_layout_flags(const char* command, int launched) {
  const std::string file = absl::GetFlag(FLAGS_plan);
  MAMMOTH_CHECK(file != "auto") << "[" << command << "] --plan auto is not taken here";
  if (!file.empty()) {
    refuse_layout_flags(command, file);
    return plan::load_plan(file);
  }
  plan::ParallelPlan p;
  p.pp = absl::GetFlag(FLAGS_pp);
  p.tp = absl::GetFlag(FLAGS_tp);
  p.sp = absl::GetFlag(FLAGS_sp);
  const int mp = p.pp * p.tp * p.sp;
  p.dp = absl::GetFlag(FLAGS_dp) > 0    ? absl::GetFlag(FLAGS_dp)
         : mp > 0 && launched % mp == 0 ? launched / mp
                                        : 1;
  p.ep = absl::GetFlag(FLAGS_ep);
  p.sp_mode = absl::GetFlag(FLAGS_sp_mode);
  p.pp_schedule = absl::GetFlag(FLAGS_pp_schedule);
  p.virtual_stages = absl::GetFlag(FLAGS_virtual_stages);
  p.pp_partition = absl::GetFlag(FLAGS_pp_partition);
  p.micro_batch = absl::GetFlag(FLAGS_micro_batch);
  p.grad_accum = absl::GetFlag(FLAGS_grad_accum);
  p.seq_len = absl::GetFlag(FLAGS_seq_len);
  p.zero = absl::GetFlag(FLAGS_zero);
  p.bucket_mb = absl::GetFlag(FLAGS_bucket_mb);
  // --offload is the short form of --offload-optimizer: one of them, or both the same.
  MAMMOTH_CHECK(!flag_changed("offload") || !flag_changed("offload_optimizer") ||
                absl::GetFlag(FLAGS_offload) == absl::GetFlag(FLAGS_offload_optimizer))
      << "[" << command << "] --offload " << absl::GetFlag(FLAGS_offload)
      << " and --offload-optimizer " << absl::GetFlag(FLAGS_offload_optimizer)
      << " disagree (--offload is its short form): give one";
  p.offload = flag_changed("offload_optimizer") ? absl::GetFlag(FLAGS_offload_optimizer)
                                                : absl::GetFlag(FLAGS_offload);
  p.offload_params = absl::GetFlag(FLAGS_offload_params);
  const memory::chunks::DeviceMemSpec device_spec =
      memory::chunks::parse_device_mem(absl::GetFlag(FLAGS_device_mem));
  (device_spec.auto_budget ? p.auto_device_mem : p.device_mem) = device_spec.bytes;
  p.host_mem = memory::chunks::parse_bytes(absl::GetFlag(FLAGS_host_mem), "--host-mem");
  p.chunk_mb = absl::GetFlag(FLAGS_chunk_mb);
  p.nvme_dir = absl::GetFlag(FLAGS_nvme_dir);
  const int64_t blocks = absl::GetFlag(FLAGS_recompute_blocks);
  MAMMOTH_CHECK(!absl::GetFlag(FLAGS_activation_checkpointing) || blocks == 0)
      << "[" << command
      << "] --activation-checkpointing recomputes every block; --recompute-blocks " << blocks
      << " says how many: give one of them";
  p.recompute_blocks = absl::GetFlag(FLAGS_activation_checkpointing) ? -1 : blocks;
  p.amp = absl::GetFlag(FLAGS_amp);
  p.device = absl::GetFlag(FLAGS_device) == "cuda" ? "cuda" : "cpu";
  return p;
}

}  // namespace mammoth::tools
