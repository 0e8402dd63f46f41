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

TEST_CASE("offload fits under data parallelism: each rank holds its share of the AdamW states") {
  const models::ModelConfig c = models::resolve_config("gpt2");
  const int64_t n = models::count_parameters(c);
  const int64_t gib = 1ll << 30, chunk = 32ll << 20;
  // The largest parameter (wte, 50257 x 768 f32 = 147 MiB) sets the chunk size.
  const int64_t big_chunk = 50257ll * 768 * 4;
  const auto one = models::offload_fits(c, 2 * gib, 8 * gib, chunk, 1);
  const auto four = models::offload_fits(c, 2 * gib, 8 * gib, chunk, 4);
  // host: W + G whole on the device; O / 4 (+ up to a chunk of each moment list) and 4
  // gradient-averaging chunks in host memory.
  CHECK(find(four, "host").device_bytes == 8 * n);
  CHECK(find(four, "host").host_bytes == (8 * n + 3) / 4 + 2 * big_chunk + 4 * big_chunk);
  // none: the states share lives on the device.
  CHECK(find(four, "none").device_bytes == 8 * n + (8 * n + 3) / 4 + 2 * big_chunk);
  CHECK(find(four, "nvme").nvme_bytes == (8 * n + 3) / 4 + 2 * big_chunk);
  // Sharding the states lets a deeper model fit wherever they were the binding part.
  CHECK(find(four, "none").max_layers > find(one, "none").max_layers);
  CHECK(find(four, "host-paged").max_layers > find(one, "host-paged").max_layers);
  // Never more than one process needs.
  for (const auto& f : four) {
    INFO(f.setting);
    CHECK(f.nvme_bytes <= find(one, f.setting.c_str()).nvme_bytes);
  }
  CHECK_THROWS_WITH(models::offload_fits(c, 2 * gib, 8 * gib, chunk, 0),
                    Catch::Contains("--dp must be >= 1"));
}
