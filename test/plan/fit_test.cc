// plan/fit: what each offload setting needs per tier is plan::predict_memory's for the plan of
// that setting, budgets pick the deepest model that fits, and data parallelism shards the AdamW
// states of the chunked settings.
#include "plan/fit.h"

#include <algorithm>
#include <catch2/catch.hpp>

#include "models/analyze.h"
#include "models/registry.h"
#include "plan/memory_model.h"

namespace mammoth::plan {
namespace {

constexpr int64_t kGiB = 1ll << 30;

const OffloadFit& find(const std::vector<OffloadFit>& fits, const char* s) {
  for (const auto& f : fits) {
    if (f.setting == s) return f;
  }
  FAIL("no setting " << s);
  return fits.front();
}

ParallelPlan base_plan(int dp = 1) {
  ParallelPlan p;
  p.dp = dp;
  p.micro_batch = 2;
  p.seq_len = 128;
  return p;
}

// The worst stage's device tier (allocator + chunks), host and NVMe of a prediction.
struct Tiers {
  int64_t device = 0, host = 0, nvme = 0;
};
Tiers tiers(const MemoryPrediction& m) {
  Tiers t;
  for (const StageMemory& s : m.stages) {
    t.device = std::max(t.device, s.device_peak + s.chunks_device);
    t.host = std::max(t.host, s.host);
    t.nvme = std::max(t.nvme, s.nvme);
  }
  return t;
}

TEST_CASE("fit: each setting's tiers are predict_memory's for its plan") {
  const models::ModelConfig c = models::resolve_config("gpt2");
  const int64_t n = models::count_parameters(c);
  // 1.25 GiB device, 4 GiB host: fp32 GPT-2 needs 16 bytes a parameter (~2 GB) for training.
  const int64_t device = 5 * kGiB / 4;
  const auto fits = offload_fits(c, base_plan(), device, 4 * kGiB);
  REQUIRE(fits.size() == 5);
  for (const char* s : {"none", "host", "nvme"}) {
    INFO(s);
    const OffloadFit& f = find(fits, s);
    REQUIRE(f.invalid.empty());
    const Tiers t = tiers(predict_memory(c, f.plan));
    CHECK(f.device_bytes == t.device);
    CHECK(f.host_bytes == t.host);
    CHECK(f.nvme_bytes == t.nvme);
  }
  // The settings are train's flags on the base plan.
  CHECK(find(fits, "none").plan == base_plan());
  CHECK(find(fits, "host").plan.offload == "host");
  CHECK(find(fits, "nvme").plan.offload == "nvme");
  CHECK(find(fits, "host-paged").plan.auto_device_mem == device);
  CHECK(find(fits, "nvme-paged").plan.offload == "nvme");
  // fp32 AdamW: the states (8 bytes a parameter) leave the device under host / nvme.
  CHECK(find(fits, "none").device_bytes > find(fits, "host").device_bytes);
  CHECK(find(fits, "host").host_bytes == 8 * n);
  CHECK(find(fits, "nvme").nvme_bytes == 8 * n);
  // Paged through a 1.25 GiB device: the chunks do not all fit beside the activations, so every
  // device-computed list is homed on the host, and the device holds the allocator's peak and
  // the cache.
  const OffloadFit& paged = find(fits, "host-paged");
  const Tiers unpaged = tiers(predict_memory(c, paged.plan));
  CHECK(paged.host_bytes == 16 * n);
  CHECK(paged.device_bytes <= device);
  CHECK(paged.device_bytes < unpaged.device);
  CHECK(paged.fits);
  CHECK(find(fits, "nvme-paged").host_bytes == 8 * n + find(fits, "nvme").host_bytes);
  CHECK(find(fits, "nvme-paged").fits);
  CHECK_FALSE(find(fits, "none").fits);
  CHECK_FALSE(find(fits, "host").fits);  // 8 bytes a parameter and the activations
}

TEST_CASE("fit: a device that holds every chunk pages nothing") {
  const models::ModelConfig c = models::resolve_config("gpt2-tiny");
  const auto fits = offload_fits(c, base_plan(), 8 * kGiB, 0);
  const OffloadFit& paged = find(fits, "host-paged");
  const Tiers t = tiers(predict_memory(c, paged.plan));
  CHECK(paged.host_bytes == 0);
  CHECK(paged.device_bytes == t.device);
  CHECK(paged.fits);
}

TEST_CASE("fit: budgets pick the deepest model, and one more layer does not fit") {
  const models::ModelConfig c = models::resolve_config("gpt2");
  const auto fits = offload_fits(c, base_plan(), kGiB, 4 * kGiB);
  for (const auto& f : fits) {
    INFO(f.setting);
    REQUIRE(f.max_layers > 0);
    models::ModelConfig deeper = c;
    deeper.n_layer = f.max_layers + 1;
    CHECK_FALSE(find(offload_fits(deeper, base_plan(), kGiB, 4 * kGiB), f.setting.c_str()).fits);
    deeper.n_layer = f.max_layers;
    CHECK(find(offload_fits(deeper, base_plan(), kGiB, 4 * kGiB), f.setting.c_str()).fits);
    CHECK(f.max_params == models::count_parameters(deeper));
  }
  // Offloading states lets a deeper model fit than keeping everything on the device, and paging
  // deeper still; NVMe-homed states leave the host only parameters and gradients.
  CHECK(find(fits, "host").max_layers > find(fits, "none").max_layers);
  CHECK(find(fits, "host-paged").max_layers > find(fits, "host").max_layers);
  CHECK(find(fits, "nvme-paged").max_layers > find(fits, "host-paged").max_layers);

  // A tiny device fits nothing, paged or not (the cache must hold a chunk of each list).
  const auto tiny = offload_fits(c, base_plan(), 1 << 20, 0);
  for (const auto& f : tiny) {
    INFO(f.setting);
    CHECK(f.max_layers == 0);
    CHECK_FALSE(f.fits);
  }
}

TEST_CASE("fit under data parallelism: each rank holds its share of the AdamW states") {
  const models::ModelConfig c = models::resolve_config("gpt2");
  // A large device and a small host: the host binds.
  const auto one = offload_fits(c, base_plan(1), 16 * kGiB, kGiB);
  const auto four = offload_fits(c, base_plan(4), 16 * kGiB, kGiB);
  for (const char* s : {"host", "nvme", "host-paged", "nvme-paged"}) {
    INFO(s);
    CHECK(find(four, s).plan.dp == 4);
    const Tiers t = tiers(predict_memory(c, find(four, s).plan));
    if (std::string(s) == "host" || std::string(s) == "nvme")
      CHECK(find(four, s).host_bytes == t.host);
  }
  CHECK(find(four, "host").host_bytes < find(one, "host").host_bytes);
  CHECK(find(four, "nvme").nvme_bytes < find(one, "nvme").nvme_bytes);
  // Sharding the states lets a deeper model fit where the host binds.
  CHECK(find(four, "host").max_layers > find(one, "host").max_layers);
}

TEST_CASE("fit: a setting the plan cannot run is refused with check()'s message") {
  const models::ModelConfig c = models::resolve_config("gpt2");
  ParallelPlan p = base_plan();
  p.tp = 2;
  const auto fits = offload_fits(c, p, 2 * kGiB, 8 * kGiB);
  // States on host or NVMe run under tp; paging under a device budget does not.
  for (const char* s : {"none", "host", "nvme"}) {
    INFO(s);
    CHECK(find(fits, s).invalid.empty());
  }
  for (const char* s : {"host-paged", "nvme-paged"}) {
    INFO(s);
    CHECK_THAT(find(fits, s).invalid, Catch::Contains("--device-mem with --tp / --pp"));
    CHECK_FALSE(find(fits, s).fits);
    CHECK(find(fits, s).max_layers == 0);
  }
  p.tp = 1;
  p.sp = 2;
  p.sp_mode = "ring";
  for (const OffloadFit& f : offload_fits(c, p, 2 * kGiB, 8 * kGiB)) {
    if (f.setting == "none") continue;
    INFO(f.setting);
    CHECK_THAT(f.invalid, Catch::Contains("not with --sp 2"));
    CHECK_FALSE(f.fits);
  }
  CHECK_THROWS_WITH(offload_fits(c, p, -1, 0), Catch::Contains("budgets must be >= 0"));
}

}  // namespace
}  // namespace mammoth::plan
