// plan/parallel_plan: JSON both ways, and every combination rule with the message users see.
#include "plan/parallel_plan.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <tuple>

#include "base/error.h"
#include "models/registry.h"

namespace mammoth::plan {
namespace {

ParallelPlan with(const std::function<void(ParallelPlan&)>& change) {
  ParallelPlan p;
  change(p);
  return p;
}

TEST_CASE("a default plan is valid, on its own and for every trainable family") {
  CHECK(check(ParallelPlan{}) == "");
  for (const char* name : {"gpt2-tiny", "llama-tiny", "bert-tiny"}) {
    const models::ModelConfig m = models::resolve_config(name);
    INFO(name);
    CHECK(check(ParallelPlan{}, {.world = 1, .model = &m}) == "");
  }
}

TEST_CASE("plans read back from JSON exactly, and unknown keys are refused by name") {
  ParallelPlan p = with([](ParallelPlan& p) {
    p.dp = 2, p.pp = 2, p.tp = 2, p.order = "tp-dp-pp-sp", p.sp_mode = "split_gather";
    p.pp_schedule = "interleaved", p.virtual_stages = 2, p.stage_cut = {0, 1, 2, 3, 4};
    p.micro_batch = 3, p.grad_accum = 4, p.seq_len = 48, p.zero = 1, p.bucket_mb = 4.5;
    p.recompute_blocks = -1, p.amp = "bf16", p.ep = 2, p.offload = "nvme";
    p.offload_params = "host";
  });
  CHECK(plan_from_json(plan_to_json(p)) == p);
  // The JSON names are the flags': offload_optimizer, offload_params; "offload" is the older
  // name of offload_optimizer, and both at once are refused.
  CHECK(plan_to_json(p).at("offload_optimizer").as_string() == "nvme");
  CHECK(plan_to_json(p).at("offload_params").as_string() == "host");
  CHECK(plan_from_json(json::parse(R"({"offload": "host"})")).offload == "host");
  CHECK_THROWS_WITH(
      plan_from_json(json::parse(R"({"offload": "host", "offload_optimizer": "host"})")),
      Catch::Contains("not both"));
  CHECK(plan_from_json(json::parse(R"({"tp": 2})")) == with([](ParallelPlan& p) { p.tp = 2; }));
  CHECK_THROWS_WITH(plan_from_json(json::parse(R"({"tp": 2, "zero_stage": 1})")),
                    Catch::Contains("unknown key 'zero_stage'"));
  CHECK_THROWS_WITH(plan_from_json(json::parse(R"({"tp": "two"})")), Catch::Contains("tp"));
  CHECK_THROWS_WITH(plan_from_json(json::parse(R"({"dp": 4294967298})")),
                    Catch::Contains("dp = 4294967298 is out of range"));
  CHECK_THROWS_WITH(plan_from_json(json::parse("[1]")), Catch::Contains("JSON object"));

  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path =
      (std::filesystem::path(tmp ? tmp : "/tmp") / "plan_roundtrip.json").string();
  save_plan(p, path);
  CHECK(load_plan(path) == p);
}

TEST_CASE("every combination rule names what is wrong") {
  const models::ModelConfig gpt2 = models::resolve_config("gpt2-tiny");
  const models::ModelConfig llama = models::resolve_config("llama-tiny");
  const models::ModelConfig bert = models::resolve_config("bert-tiny");
  struct Case {
    ParallelPlan plan;
    PlanContext context;
    std::string message;
  };
  const std::vector<Case> cases = {
      {with([](ParallelPlan& p) { p.tp = 0; }), {}, "must be >= 1"},
      {with([](ParallelPlan& p) { p.sp_mode = "megatron"; }), {}, "--sp-mode must be"},
      {with([](ParallelPlan& p) { p.pp_schedule = "1F1B"; }), {}, "--pp-schedule must be"},
      {with([](ParallelPlan& p) { p.micro_batch = 0; }), {}, "--micro-batch must be > 0"},
      {with([](ParallelPlan& p) { p.zero = 4; }), {}, "--zero must be 0, 1, 2 or 3"},
      {with([](ParallelPlan& p) { p.offload = "disk"; }),
       {},
       "--offload-optimizer (--offload) must be none, host"},
      {with([](ParallelPlan& p) { p.offload_params = "disk"; }),
       {},
       "--offload-params must be none, host"},
      {with([](ParallelPlan& p) { p.amp = "fp8"; }), {}, "--amp must be fp32, bf16 or fp16"},
      {with([](ParallelPlan& p) { p.chunk_mb = 0; }), {}, "--chunk-mb"},
      {with([](ParallelPlan& p) { p.device_mem = 1, p.auto_device_mem = 2; }), {}, "not both"},
      {with([](ParallelPlan& p) { p.order = "tp-xp"; }), {}, "unknown axis 'xp'"},
      {with([](ParallelPlan& p) { p.order = "tp-tp"; }), {}, "names tp twice"},
      {with([](ParallelPlan& p) { p.order = "tp-dp", p.pp = 2; }), {}, "leaves out pp"},
      {with([](ParallelPlan& p) { p.dp = 2; }), {.world = 4}, "= 2 but 4 process(es)"},
      {with([](ParallelPlan& p) { p.dp = 2; }), {.world = 1}, "mpirun -np 2"},
      {with([](ParallelPlan& p) { p.sp = 2; }), {}, "needs --sp-mode ulysses or ring"},
      {with([](ParallelPlan& p) { p.zero = 2; }), {}, "needs --dp > 1"},
      {with([](ParallelPlan& p) { p.sp_mode = "ulysses"; }), {}, "splits the sequence"},
      {with([](ParallelPlan& p) { p.pp = 2, p.virtual_stages = 2; }), {}, "needs --pp-schedule"},
      {with([](ParallelPlan& p) { p.virtual_stages = 2, p.pp_schedule = "interleaved"; }),
       {},
       "needs --pp > 1"},
      {with([](ParallelPlan& p) {
         p.pp = 2, p.stage_cut = {0, 2};
       }),
       {},
       "needs 3"},
      {with([](ParallelPlan& p) {
         p.pp = 2, p.stage_cut = {0, 0, 4};
       }),
       {},
       "strictly"},
      {with([](ParallelPlan& p) {
         p.pp = 2, p.stage_cut = {0, 1, 3};
       }),
       {.model = &gpt2},
       "must end at the model's 4 layers"},
      {with([](ParallelPlan& p) { p.offload = "nvme"; }), {.run = true}, "needs --nvme-dir"},
      {with([](ParallelPlan& p) { p.offload_params = "nvme"; }),
       {.run = true},
       "--offload-params nvme needs --nvme-dir"},
      {with([](ParallelPlan& p) { p.offload_params = "host", p.dp = 2; }),
       {},
       "--offload-params host with --dp runs as --zero 3 --offload-params nvme only"},
      {with([](ParallelPlan& p) {
         p.offload_params = "nvme", p.dp = 2, p.zero = 3, p.offload = "host";
       }),
       {},
       "with --offload-optimizer host is not built yet"},
      {with([](ParallelPlan& p) { p.offload_params = "nvme", p.dp = 2, p.zero = 3, p.tp = 2; }),
       {},
       "runs with --dp only so far"},
      {with([](ParallelPlan& p) { p.device = "cuda", p.offload_params = "nvme"; }),
       {},
       "pinned host memory only"},
      {with([](ParallelPlan& p) { p.offload = "host", p.dp = 2, p.zero = 1; }), {}, "ZeRO-Offload"},
      {with([](ParallelPlan& p) { p.offload = "host", p.sp = 2, p.sp_mode = "ring"; }),
       {},
       "not with --sp 2"},
      {with([](ParallelPlan& p) { p.offload = "host", p.tp = 2, p.dp = 2; }),
       {},
       "runs without --dp so far"},
      {with([](ParallelPlan& p) { p.offload = "nvme", p.tp = 2, p.device_mem = 1 << 20; }),
       {},
       "leave --device-mem at 0"},
      {with([](ParallelPlan& p) { p.offload_params = "host", p.tp = 2; }),
       {},
       "--offload-params host with --tp is not built yet"},
      {with([](ParallelPlan& p) { p.offload_params = "nvme", p.pp = 2; }),
       {},
       "--offload-params nvme with --pp is not built yet"},
      {with([](ParallelPlan& p) { p.device = "cuda", p.tp = 2; }), {}, "not wired to NCCL"},
      {with([](ParallelPlan& p) { p.device = "cuda", p.dp = 2, p.zero = 2; }),
       {},
       "not enabled on CUDA"},
      {with([](ParallelPlan& p) { p.device = "cuda", p.auto_device_mem = 1 << 30; }),
       {},
       "auto is not implemented on CUDA"},
      {with([](ParallelPlan& p) { p.device = "cuda", p.dp = 2, p.offload = "host"; }),
       {},
       "not implemented on CUDA"},
      {with([](ParallelPlan& p) { p.pp = 2, p.tp = 2; }),
       {.model = &bert},
       "BERT's tensor-parallel form has no pipeline stages"},
      {with([](ParallelPlan& p) { p.pp = 8; }), {.model = &gpt2}, "8 stages but"},
      {with([](ParallelPlan& p) { p.recompute_blocks = 5; }), {.model = &gpt2}, "exceeds"},
      {with([](ParallelPlan& p) { p.seq_len = 128, p.pp = 2; }),
       {.model = &gpt2},
       "(+1 with --pp)"},
      {with([](ParallelPlan& p) { p.seq_len = 127, p.sp = 3, p.sp_mode = "ring"; }),
       {.model = &gpt2},
       "padded to a multiple of 6 = 132"},
      {with([](ParallelPlan& p) { p.tp = 3; }), {.model = &gpt2}, "attention heads"},
      {with([](ParallelPlan& p) { p.tp = 8; }), {.model = &llama}, "attention heads"},
      {with([](ParallelPlan& p) { p.sp = 8, p.sp_mode = "ulysses"; }),
       {.model = &gpt2},
       "do not divide by --sp 8"},
      {with([](ParallelPlan& p) { p.recompute_blocks = -2; }), {}, "recompute_blocks"},
  };
  for (const Case& c : cases) {
    INFO(plan_summary(c.plan) << " | expected: " << c.message);
    const std::string got = check(c.plan, c.context);
    CHECK_THAT(got, Catch::Contains(c.message));
    if (!got.empty()) CHECK_THROWS_WITH(validate(c.plan, c.context), Catch::Contains(": [plan] "));
  }

  // BERT's masked LM has pipeline stages of its one-device blocks.
  CHECK(check(with([](ParallelPlan& p) { p.pp = 2, p.grad_accum = 2; }), {.model = &bert}) == "");

  // Untied GPT-2 has no tensor-parallel form.
  models::ModelConfig untied = gpt2;
  untied.tie_embeddings = false;
  CHECK_THAT(check(with([](ParallelPlan& p) { p.tp = 2; }), {.model = &untied}),
             Catch::Contains("untied LM head"));
  // The same plans are valid once the rule's condition is met.
  CHECK(check(with([](ParallelPlan& p) { p.dp = 2, p.zero = 3; }), {.world = 2}) == "");
  CHECK(check(with([](ParallelPlan& p) {
                p.pp = 2, p.pp_schedule = "interleaved", p.virtual_stages = 2, p.grad_accum = 2;
              }),
              {.world = 2, .model = &gpt2}) == "");
  CHECK(check(with([](ParallelPlan& p) { p.tp = 4; }), {.model = &llama}) == "");
  CHECK(check(with([](ParallelPlan& p) {
                p.offload = "nvme", p.offload_params = "nvme", p.nvme_dir = "/tmp";
              }),
              {.world = 1, .model = &gpt2, .run = true}) == "");
  // Offload under tp (states on host or NVMe) and pp (parameters on host too), without dp.
  CHECK(check(with([](ParallelPlan& p) { p.offload = "nvme", p.tp = 2, p.nvme_dir = "/tmp"; }),
              {.world = 2, .model = &gpt2, .run = true}) == "");
  CHECK(check(with([](ParallelPlan& p) { p.offload_params = "host", p.pp = 2; }),
              {.world = 2, .model = &gpt2}) == "");
  CHECK(check(with([](ParallelPlan& p) {
                p.offload_params = "nvme", p.dp = 2, p.zero = 3, p.nvme_dir = "/tmp";
              }),
              {.world = 2, .model = &gpt2, .run = true}) == "");
  CHECK(check(with([](ParallelPlan& p) { p.sp = 2, p.sp_mode = "ring", p.seq_len = 124; }),
              {.model = &gpt2}) == "");
}

TEST_CASE("Ulysses and ring attention refuse attention dropout by name") {
  models::ModelConfig gpt2 = models::resolve_config("gpt2-tiny");
  gpt2.attn_dropout = 0.1;
  for (const char* mode : {"ulysses", "ring"}) {
    const ParallelPlan p = with([mode](ParallelPlan& q) { q.sp = 2, q.sp_mode = mode; });
    CHECK_THAT(check(p, {.model = &gpt2}),
               Catch::Contains("has no attention dropout") && Catch::Contains("use --dropout 0"));
  }
  // split_gather attends locally, with dropout; no dropout is fine under ring.
  CHECK(check(with([](ParallelPlan& q) { q.tp = 2, q.sp_mode = "split_gather"; }),
              {.model = &gpt2}) == "");
  gpt2.attn_dropout = 0;
  CHECK(check(with([](ParallelPlan& q) { q.sp = 2, q.sp_mode = "ring"; }), {.model = &gpt2}) == "");
}

TEST_CASE("expert parallelism: --ep's rules name what is wrong") {
  const models::ModelConfig mixtral = models::resolve_config("mixtral-tiny");  // 4 experts
  const models::ModelConfig llama = models::resolve_config("llama-tiny");
  const std::vector<std::pair<ParallelPlan, std::string>> cases = {
      {with([](ParallelPlan& p) { p.ep = 0; }), "--ep must be >= 1"},
      {with([](ParallelPlan& p) { p.dp = 3, p.ep = 2; }), "--ep 2 must divide --dp 3"},
      {with([](ParallelPlan& p) { p.dp = 2, p.ep = 2, p.sp = 2, p.sp_mode = "ring"; }),
       "does not combine with --sp or --sp-mode"},
      {with([](ParallelPlan& p) { p.dp = 2, p.ep = 2, p.offload = "host"; }), "--offload"},
      {with([](ParallelPlan& p) { p.dp = 2, p.ep = 2, p.device = "cuda"; }), "CPU (MPI) only"},
  };
  for (const auto& [plan, message] : cases) {
    INFO(plan_summary(plan) << " | expected: " << message);
    CHECK_THAT(check(plan, {.model = &mixtral}), Catch::Contains(message));
  }
  const ParallelPlan ep2 = with([](ParallelPlan& p) { p.dp = 4, p.ep = 2, p.zero = 2; });
  CHECK(check(ep2, {.world = 4, .model = &mixtral}) == "");
  // ZeRO 3 shards the shared parameters over dp and the experts over their holders.
  CHECK(check(with([](ParallelPlan& p) { p.dp = 4, p.ep = 2, p.zero = 3; }),
              {.world = 4, .model = &mixtral}) == "");
  // Under --tp each tp coordinate has its own expert groups (the experts replicated over tp).
  CHECK(check(with([](ParallelPlan& p) { p.dp = 2, p.ep = 2, p.tp = 2; }),
              {.world = 4, .model = &mixtral}) == "");
  CHECK_THAT(check(ep2, {.model = &llama}), Catch::Contains("needs a mixture-of-experts model"));
  models::ModelConfig three = mixtral;
  three.moe_experts = 3;
  CHECK_THAT(check(ep2, {.model = &three}),
             Catch::Contains("must divide mixtral-tiny's 3 experts"));
  CHECK(plan_summary(ep2) ==
        "dp4 pp1 tp1 sp1 (tp-sp-dp-pp) ep2 mb8x1 seq 64 zero2 offload none fp32");
}

TEST_CASE("mixtral runs under tp, pp, pp x tp and ep x pp, not under a sequence split") {
  const models::ModelConfig mixtral = models::resolve_config("mixtral-tiny");
  CHECK(check(with([](ParallelPlan& p) { p.tp = 2; }), {.world = 2, .model = &mixtral}) == "");
  CHECK(check(with([](ParallelPlan& p) { p.pp = 2; }), {.world = 2, .model = &mixtral}) == "");
  CHECK(check(with([](ParallelPlan& p) { p.pp = 2, p.tp = 2; }), {.world = 4, .model = &mixtral}) ==
        "");
  CHECK(check(with([](ParallelPlan& p) { p.dp = 2, p.ep = 2, p.pp = 2, p.zero = 2; }),
              {.world = 4, .model = &mixtral}) == "");
  CHECK(check(with([](ParallelPlan& p) { p.dp = 2, p.zero = 3; }),
              {.world = 2, .model = &mixtral}) == "");
  const std::vector<std::pair<ParallelPlan, std::string>> cases = {
      {with([](ParallelPlan& p) { p.tp = 2, p.sp_mode = "split_gather"; }),
       "mixtral (mixture of experts) does not run under sequence parallelism"},
      {with([](ParallelPlan& p) { p.sp = 2, p.sp_mode = "ulysses"; }),
       "the router losses average over every token"},
      {with([](ParallelPlan& p) { p.sp = 2, p.sp_mode = "ring"; }), "--sp-mode ring"},
      {with([](ParallelPlan& p) { p.pp = 2, p.amp = "bf16"; }),
       "Mixtral's stages carry the router sums with the hidden states"},
      {with([](ParallelPlan& p) { p.dp = 2, p.offload = "host"; }),
       "mixtral does not run under offload"},
  };
  for (const auto& [plan, message] : cases) {
    INFO(plan_summary(plan) << " | expected: " << message);
    CHECK_THAT(check(plan, {.model = &mixtral}), Catch::Contains(message));
  }
}

TEST_CASE("classifiers and LoRA adapters: their rules live in the plan's check") {
  const models::ModelConfig bert = models::resolve_config("bert-tiny");
  const models::ModelConfig vit = models::resolve_config("vit-tiny");
  const models::ModelConfig gpt2 = models::resolve_config("gpt2-tiny");
  const PlanContext bert_classify{.model = &bert, .task = Task::kClassifier};
  const PlanContext vit_classify{.model = &vit, .task = Task::kClassifier};
  // What runs: BERT and ViT under tp (with split_gather), every sp mode and pp with dp.
  CHECK(check(with([](ParallelPlan& p) { p.tp = 2, p.sp_mode = "split_gather"; }), bert_classify) ==
        "");
  CHECK(check(with([](ParallelPlan& p) { p.pp = 2, p.dp = 2; }), bert_classify) == "");
  CHECK(check(with([](ParallelPlan& p) { p.sp = 2, p.sp_mode = "ring"; }), bert_classify) == "");
  CHECK(check(with([](ParallelPlan& p) { p.sp = 2, p.sp_mode = "ring"; }), vit_classify) == "");
  CHECK(check(with([](ParallelPlan& p) { p.pp = 2; }), vit_classify) == "");
  CHECK(check(with([](ParallelPlan& p) { p.sp = 2, p.sp_mode = "ulysses"; }), vit_classify) == "");
  const std::vector<std::tuple<ParallelPlan, PlanContext, std::string>> cases = {
      {with([](ParallelPlan& p) { p.pp = 2, p.tp = 2; }), bert_classify,
       "its sharded form has no pipeline stages yet"},
      {with([](ParallelPlan& p) { p.offload = "host"; }), bert_classify,
       "classification (bert) with --offload"},
      {with([](ParallelPlan& p) { p.pp = 2, p.pp_schedule = "gpipe"; }),
       {.model = &gpt2, .task = Task::kClassifier},
       "model family gpt2 has no classification head"},
      // A ViT trains only as a classifier.
      {ParallelPlan{}, {.model = &vit}, "has no language-model objective"},
      {with([](ParallelPlan& p) { p.offload = "host"; }),
       {.model = &gpt2, .adapters = true},
       "LoRA with --offload"},
      {with([](ParallelPlan& p) { p.dp = 2, p.ep = 2; }),
       {.model = &gpt2, .adapters = true},
       "--ep 2 does not combine with LoRA adapters"},
  };
  for (const auto& [plan, context, message] : cases) {
    INFO(plan_summary(plan) << " | expected: " << message);
    CHECK_THAT(check(plan, context), Catch::Contains(message));
  }
}

TEST_CASE("expert parallelism's exchange volume per step") {
  const models::ModelConfig mixtral = models::resolve_config("mixtral-tiny");
  REQUIRE(mixtral.moe_top_k == 2);
  REQUIRE(mixtral.d_model == 64);
  REQUIRE(mixtral.n_layer == 2);
  ParallelPlan p =
      with([](ParallelPlan& p) { p.dp = 4, p.ep = 2, p.micro_batch = 8, p.seq_len = 64; });
  // 8 x 64 tokens x top 2 = 1024 rows, half to the other rank, 64 f32 each = 128 KiB per
  // exchange; 4 exchanges (dispatch, return; forward, backward) x 2 layers.
  CHECK(expert_exchange_bytes_per_step(p, mixtral) == 4 * 2 * 512 * 64 * 4);
  p.ep = 4;  // three quarters leave
  CHECK(expert_exchange_bytes_per_step(p, mixtral) == 4 * 2 * 768 * 64 * 4);
  p.grad_accum = 3;
  CHECK(expert_exchange_bytes_per_step(p, mixtral) == 3 * 4 * 2 * 768 * 64 * 4);
  p.ep = 1;
  CHECK(expert_exchange_bytes_per_step(p, mixtral) == 0);
  CHECK(expert_exchange_bytes_per_step(with([](ParallelPlan& p) { p.dp = 2, p.ep = 2; }),
                                       models::resolve_config("llama-tiny")) == 0);
}

TEST_CASE("the summary line says the layout") {
  CHECK(plan_summary(with([](ParallelPlan& p) {
          p.dp = 2, p.tp = 2, p.micro_batch = 4, p.grad_accum = 2, p.zero = 1;
        })) == "dp2 pp1 tp2 sp1 (tp-sp-dp-pp) mb4x2 seq 64 zero1 offload none fp32");
}

}  // namespace
}  // namespace mammoth::plan
