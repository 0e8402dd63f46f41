// The shipped cluster files load, round-trip through JSON, and unknown keys are refused.
#include "plan/cluster.h"

#include <catch2/catch.hpp>

#include "base/error.h"
#include "base/json.h"

namespace mammoth::plan {
namespace {

TEST_CASE("shipped clusters load by name and round-trip", "[plan][cluster]") {
  for (const std::string& name : shipped_cluster_names()) {
    const Cluster c = load_cluster(name);
    CHECK(c.name == name);
    CHECK(c.devices_per_node == 8);
    CHECK(c.matmul_efficiency > 0.3);
    CHECK(c.matmul_efficiency <= 1.0);
    const Cluster again = cluster_from_json(cluster_to_json(c));
    CHECK(again.device_memory == c.device_memory);
    CHECK(again.inter_node.bandwidth == Approx(c.inter_node.bandwidth));
    CHECK(again.peak_bf16 == Approx(c.peak_bf16));
  }
  const Cluster a100 = load_cluster("dgx_a100_80gb");
  CHECK(a100.peak_bf16 == Approx(312e12));
  CHECK(a100.peak_for("fp32") == Approx(156e12));  // TF32 tensor cores
  CHECK(a100.intra_node.bandwidth == Approx(300e9));
  CHECK(a100.inter_node.bandwidth == Approx(25e9));
  const Cluster h200 = load_cluster("h200_node");
  CHECK(h200.world() == 8);
  CHECK(h200.device_memory_bandwidth == Approx(4.8e12));
}

TEST_CASE("cluster JSON refuses unknown and missing keys by name", "[plan][cluster]") {
  json::Value v = cluster_to_json(load_cluster("h100_cluster"));
  json::Value typo = v;
  typo.at("links").at("inter_node").set("GBPS", 50);
  try {
    cluster_from_json(typo, "typo.json");
    FAIL("accepted an unknown key");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("GBPS"));
  }
  json::Value extra = v;
  extra.set("gpus", 8);
  CHECK_THROWS_WITH(cluster_from_json(extra), Catch::Contains("unknown key 'gpus'"));
  json::Value neg = v;
  neg.set("matmul_efficiency", 1.5);
  CHECK_THROWS_WITH(cluster_from_json(neg), Catch::Contains("matmul_efficiency"));
  CHECK_THROWS_WITH(load_cluster("no_such_cluster"), Catch::Contains("dgx_a100_80gb"));
}

}  // namespace
}  // namespace mammoth::plan
