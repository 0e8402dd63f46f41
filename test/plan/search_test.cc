// The search: branch-and-bound returns the brute-force optimum on small meshes, its output is
// deterministic, and every plan it emits is valid and fits; the planner's best GPT-3 175B
// plan on 1024 A100s is at least as fast as its prediction for Megatron-LM's layout.
#include "plan/search.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "base/json.h"
#include "models/registry.h"
#include "plan/cluster.h"
#include "plan/memory_model.h"
#include "test/plan/published_models.h"

namespace mammoth::plan {
namespace {

json::Value without_timing(SearchResult r) {
  r.seconds = 0;
  r.cpu_seconds = 0;
  return r.to_json();
}

void same_top(const SearchResult& a, const SearchResult& b) {
  REQUIRE(a.plans.size() == b.plans.size());
  for (size_t i = 0; i < a.plans.size(); ++i) {
    INFO("rank " << i + 1 << ": " << plan_summary(a.plans[i].plan) << " vs "
                 << plan_summary(b.plans[i].plan));
    CHECK(a.plans[i].plan == b.plans[i].plan);
    CHECK(a.plans[i].time.step_time == b.plans[i].time.step_time);
  }
}

TEST_CASE("branch-and-bound finds the brute-force top plans on small meshes", "[plan][search]") {
  struct Case {
    const char* model;
    const char* cluster;
    int world;
    int64_t batch, seq;
  };
  for (const Case& c : {Case{"gpt2-medium", "h200_node", 8, 32, 1024},
                        Case{"llama-7b", "dgx_a100_80gb", 16, 64, 2048},
                        Case{"gpt2-xl", "dgx_a100_80gb", 32, 96, 1024},
                        Case{"bert-large", "h200_node", 4, 64, 512}}) {
    const models::ModelConfig config = models::resolve_config(c.model);
    const Cluster cluster = load_cluster(c.cluster);
    SearchOptions o;
    o.world = c.world;
    o.global_batch = c.batch;
    o.seq_len = c.seq;
    o.top_k = 5;
    const SearchResult bb = search(config, cluster, o);
    o.branch_and_bound = false;
    const SearchResult brute = search(config, cluster, o);
    std::printf(
        "%s on %d x %s: %lld cores, branch-and-bound predicted %lld plans, brute force "
        "%lld; best %s (%.4g s)\n",
        c.model, c.world, c.cluster, static_cast<long long>(bb.cores),
        static_cast<long long>(bb.evaluated), static_cast<long long>(brute.evaluated),
        bb.plans.empty() ? "-" : plan_summary(bb.plans[0].plan).c_str(),
        bb.plans.empty() ? 0.0 : bb.plans[0].time.step_time);
    REQUIRE(!bb.plans.empty());
    CHECK(bb.evaluated <= brute.evaluated);
    same_top(bb, brute);
    PlanContext context{.world = c.world, .model = &config};
    for (const RankedPlan& r : bb.plans) {
      ParallelPlan cpu = r.plan;
      cpu.device = "cpu";
      CHECK(check(cpu, context) == "");
      CHECK(memory_misfit(r.memory, cluster) == "");
      CHECK(r.plan.global_batch() == c.batch);
      CHECK(r.plan.world() == c.world);
    }
  }
}

TEST_CASE("a mixture of experts is searched with expert parallelism too", "[plan][search]") {
  const models::ModelConfig config = models::resolve_config("mixtral-8x7b");
  const Cluster cluster = load_cluster("dgx_a100_80gb");
  SearchOptions o;
  o.world = 32;
  o.global_batch = 64;
  o.seq_len = 2048;
  o.top_k = 5;
  o.count_model_copy = false;  // what the plans need, not today's runtime's single-model copy
  o.amp = "fp32";              // Mixtral's pipeline stages carry the router sums in f32
  const SearchResult bb = search(config, cluster, o);
  o.branch_and_bound = false;
  const SearchResult brute = search(config, cluster, o);
  REQUIRE(!bb.plans.empty());
  same_top(bb, brute);
  // The experts' split is what lets the best plan fit: a rank holds 1/ep of them. Its variants
  // at other ep are slower or do not fit the GPU: the search weighed both.
  const RankedPlan& best = bb.plans[0];
  CHECK(best.plan.ep > 1);
  TimeModel model(config, cluster, o.time);
  int variants = 0, over_memory = 0;
  for (int ep = 1; ep <= best.plan.dp; ++ep) {
    if (best.plan.dp % ep != 0 || config.moe_experts % ep != 0 || ep == best.plan.ep) continue;
    ParallelPlan p = best.plan;
    p.ep = ep;
    INFO(plan_summary(best.plan) << " vs ep " << ep);
    if (!memory_misfit(predict_memory(config, p), cluster, o.count_model_copy).empty()) {
      CHECK(predict_memory(config, p).planned_peak() > best.memory.planned_peak());
      ++over_memory;
      continue;
    }
    CHECK(model.predict(p).step_time >= best.time.step_time);
    ++variants;
  }
  CHECK(variants + over_memory >= 1);
  // Every plan brute force evaluated, ranked: expert-parallel ones among them, each ep dividing
  // its dp and the experts.
  o.top_k = 1 << 20;
  const SearchResult all = search(config, cluster, o);
  REQUIRE(static_cast<int64_t>(all.plans.size()) == all.evaluated);
  int expert_parallel = 0;
  for (const RankedPlan& r : all.plans) {
    if (r.plan.ep == 1) continue;
    CHECK(r.plan.dp % r.plan.ep == 0);
    CHECK(config.moe_experts % r.plan.ep == 0);
    ++expert_parallel;
  }
  std::printf(
      "mixtral-8x7b on 32 x dgx_a100_80gb: best %s (%.4g s), %d ep variants slower, %d over "
      "memory; %d of %zu plans expert-parallel\n",
      plan_summary(best.plan).c_str(), best.time.step_time, variants, over_memory, expert_parallel,
      all.plans.size());
  CHECK(expert_parallel > 0);
}

TEST_CASE("two searches give identical output", "[plan][search]") {
  const models::ModelConfig config = models::resolve_config("llama-13b");
  const Cluster cluster = load_cluster("h100_cluster");
  SearchOptions o;
  o.world = 64;
  o.global_batch = 256;
  o.seq_len = 4096;
  const SearchResult a = search(config, cluster, o);
  const SearchResult b = search(config, cluster, o);
  CHECK(json::dump(without_timing(a)) == json::dump(without_timing(b)));
  std::printf("%s", format_plans(a, cluster).c_str());
}

// Narayanan et al. 2021, section 5.1 and its training-time estimate: GPT-3 175B on 1,024 A100s,
// batch 1,536, 140 TFLOP/s per GPU; layout t = 8, p = 16 (d = 8), as Megatron-LM's
// examples/gpt3/train_gpt3_175b_distributed.sh runs it. The planner searches the same problem
// with the same system assumptions.
TEST_CASE("GPT-3 175B on 1024 A100: the best plan is no slower than Megatron's layout",
          "[plan][search][published]") {
  const models::ModelConfig config = testing::megatron_gpt(96, 12288, 96);
  const Cluster cluster = load_cluster("dgx_a100_80gb");
  SearchOptions o;
  o.world = 1024;
  o.global_batch = 1536;
  o.seq_len = 2048;
  o.amp = "fp16";
  o.top_k = 3;
  o.time = {.flash_attention = false, .overlap_dp = false};
  // What each plan needs, not what today's runtime adds (the single-device model beside its
  // shards, every stage's parameters on each pipeline rank): under that no 175B plan fits an
  // 80 GB GPU, Megatron's included, which ran.
  o.count_model_copy = false;
  const SearchResult best = search(config, cluster, o);
  REQUIRE(!best.plans.empty());
  TimeModel model(config, cluster, o.time);
  ParallelPlan megatron;
  megatron.tp = 8;
  megatron.pp = 16;
  megatron.dp = 8;
  megatron.seq_len = 2048;
  megatron.micro_batch = 1;
  megatron.grad_accum = 192;
  megatron.pp_schedule = "interleaved";
  megatron.virtual_stages = 2;
  megatron.recompute_blocks = -1;
  megatron.amp = "fp16";
  const TimePrediction published = model.predict(megatron);
  // Megatron's layout fits the planner's memory model too, and so does the planner's choice.
  CHECK(memory_misfit(predict_memory(config, megatron), cluster, false) == "");
  CHECK(memory_misfit(best.plans[0].memory, cluster, false) == "");
  std::printf(
      "GPT-3 175B, 1024 A100: Megatron layout %s: %.3f s/step, %.1f TFLOP/s per GPU "
      "(published ~140); planner's best %s: %.3f s/step, %.1f TFLOP/s per GPU\n%s",
      plan_summary(megatron).c_str(), published.step_time, published.tflops_per_gpu,
      plan_summary(best.plans[0].plan).c_str(), best.plans[0].time.step_time,
      best.plans[0].time.tflops_per_gpu, format_plans(best, cluster).c_str());
  CHECK(best.plans[0].time.step_time <= published.step_time);
}

}  // namespace
}  // namespace mammoth::plan
