// models::offload_fits: per-tier needs of each --offload setting and the deepest model that
// fits, checked against hand-computed byte counts of GPT-2 (124M).
#include <catch2/catch.hpp>

#include "models/analyze.h"
#include "models/registry.h"

using namespace mammoth;

namespace {
const models::OffloadFit& find(const std::vector<models::OffloadFit>& fits, const char* s) {
  for (const auto& f : fits) {
    if (f.setting == s) return f;
  }
  FAIL("no setting " << s);
  return fits.front();
}
}  // namespace

TEST_CASE("offload fits: tier needs follow W + G + O and budgets pick the deepest model") {
  const models::ModelConfig c = models::resolve_config("gpt2");
  const int64_t n = models::count_parameters(c);
  const int64_t gib = 1ll << 30;
  // 2 GiB device, 8 GiB host: fp32 GPT-2 needs 16 bytes/param = ~1.98 GB in total.
  const auto fits = models::offload_fits(c, 2 * gib, 8 * gib, 32ll << 20);
  REQUIRE(fits.size() == 5);
  const auto& none = find(fits, "none");
  CHECK(none.device_bytes == 16 * n);
  CHECK(none.host_bytes == 0);
  const auto& host = find(fits, "host");
  CHECK(host.device_bytes == 8 * n);
  CHECK(host.host_bytes == 8 * n);
  const auto& nvme = find(fits, "nvme");
  CHECK(nvme.nvme_bytes == 8 * n);
  const auto& paged = find(fits, "host-paged");
  CHECK(paged.host_bytes == 16 * n);
  CHECK(paged.device_bytes < 16 * n);

  // Each setting's deepest model fits and one more layer does not.
  for (const auto& f : fits) {
    INFO(f.setting);
    REQUIRE(f.max_layers > 0);
    models::ModelConfig deeper = c;
    deeper.n_layer = f.max_layers + 1;
    const auto next = models::offload_fits(deeper, 2 * gib, 8 * gib, 32ll << 20);
    CHECK_FALSE(find(next, f.setting.c_str()).fits);
    deeper.n_layer = f.max_layers;
    CHECK(find(models::offload_fits(deeper, 2 * gib, 8 * gib, 32ll << 20), f.setting.c_str()).fits);
  }
  // Offloading states lets a deeper model fit than keeping everything on the device, and paging
  // deeper still (host-bound instead of device-bound).
  CHECK(find(fits, "host").max_layers > find(fits, "none").max_layers);
  CHECK(find(fits, "host-paged").max_layers > find(fits, "host").max_layers);
  CHECK(find(fits, "nvme-paged").max_layers > find(fits, "host-paged").max_layers);

  // A tiny device budget fits nothing without paging.
  const auto tiny = models::offload_fits(c, 1 << 20, 0, 32ll << 20);
  CHECK(find(tiny, "none").max_layers == 0);
  CHECK_FALSE(find(tiny, "none").fits);
}
