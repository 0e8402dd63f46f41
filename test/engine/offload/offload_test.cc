// Training with chunked parameters, gradients and AdamW states (engine/offload) gives the SAME
// losses, bitwise, as the plain loop: optimizer states on host or NVMe, and parameters +
// gradients paged under a device budget 4x smaller than the model's state, whose peak (the
// chunk manager's accounting) stays within it. Too-small budgets are errors naming sizes.
#include "engine/offload/offload.h"

#include <catch2/catch.hpp>
#include <cstdio>

#include "base/error.h"
#include "engine/data/token_shard.h"
#include "engine/ops.h"
#include "engine/train/trainer.h"
#include "models/registry.h"
#include "test/testing/test_dir.h"
#include "test/testing/token_data.h"

using namespace mammoth;
using engine::offload::Mode;
using engine::offload::Offload;
using engine::offload::OffloadOptions;
using memory::chunks::Tier;

namespace {

std::shared_ptr<models::LanguageModel> tiny_model(int64_t vocab = 48) {
  models::ModelOptions mo;
  mo.vocab_size = vocab;
  mo.max_seq = 16;
  mo.dropout = 0.1;  // dropout's RNG must not notice the offload either
  mo.seed = 3;
  return models::create_language_model("gpt2-tiny", mo);
}

engine::train::TrainOptions options() {
  engine::train::TrainOptions o;
  o.steps = 10;
  o.micro_batch = 4;
  o.seq_len = 16;
  o.grad_accum = 2;  // gradients accumulate in their chunks across micro-batches
  o.lr = 3e-3;
  o.warmup = 2;
  o.eval_every = 5;  // evaluation passes are off the recorded trace
  o.quiet = true;
  o.seed = 11;
  return o;
}

struct Run {
  std::vector<double> losses;
  std::vector<double> first_param;  // a parameter's values after training
  memory::chunks::TierStats device, host, nvme;
  int64_t state_bytes = 0;
  int64_t chunk_bytes = 0;
  std::string report;
  Offload::AutoBudget auto_budget;
};

// offload == nullptr: the plain loop.
Run run(const std::string& data_path, const OffloadOptions* offload, int64_t vocab = 48) {
  auto model = tiny_model(vocab);
  const auto data = data::TokenDataset::open(data_path);
  engine::train::TrainOptions o = options();
  std::unique_ptr<Offload> off;
  if (offload) {
    off = std::make_unique<Offload>(model->named_parameters(), *offload);
    o.offload = off.get();
  }
  json::Value config = json::Value::object();
  config.set("model", "gpt2-tiny");
  Run r;
  r.losses =
      engine::train::train(
          *model,
          [&](const engine::Tensor& in, const engine::Tensor& tg) { return model->loss(in, tg); },
          data, data::TokenDataset(), o, config)
          .losses;
  if (off) {
    off->manager().synchronize();
    r.device = off->manager().stats(Tier::kDevice);
    r.host = off->manager().stats(Tier::kHost);
    r.nvme = off->manager().stats(Tier::kNvme);
    r.state_bytes = off->model_state_bytes();
    r.chunk_bytes = off->manager().chunk_bytes();
    r.report = off->report();
    r.auto_budget = off->auto_budget();
    off.reset();  // parameters get ordinary storage back
  }
  r.first_param = model->named_parameters().front().second.to_vector();
  return r;
}

}  // namespace

TEST_CASE("optimizer states on host or NVMe train bitwise like the plain loop") {
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir);
  const Run base = run(data, nullptr);
  REQUIRE(base.losses.size() == 10);
  REQUIRE(base.losses.back() < base.losses.front());

  OffloadOptions none;
  none.chunk_bytes = 16 << 10;
  const Run r_none = run(data, &none);
  CHECK(r_none.losses == base.losses);
  CHECK(r_none.first_param == base.first_param);

  OffloadOptions host = none;
  host.mode = Mode::kHost;
  const Run r_host = run(data, &host);
  CHECK(r_host.losses == base.losses);
  CHECK(r_host.first_param == base.first_param);
  CHECK(r_host.host.home_bytes > 0);

  OffloadOptions nvme = none;
  nvme.mode = Mode::kNvme;
  nvme.nvme_dir = dir.path();
  const Run r_nvme = run(data, &nvme);
  CHECK(r_nvme.losses == base.losses);
  CHECK(r_nvme.first_param == base.first_param);
  CHECK(r_nvme.nvme.home_bytes > 0);
  CHECK(r_nvme.nvme.moves_out > 0);  // states were read back from the file...
  CHECK(r_nvme.nvme.moves_in > 0);   // ...and written to it
  std::fprintf(stderr, "%s", r_nvme.report.c_str());
}

TEST_CASE("a model 4x the device budget pages and trains bitwise like the unconstrained run") {
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir);
  const Run base = run(data, nullptr);

  for (Mode mode : {Mode::kNone, Mode::kHost, Mode::kNvme}) {
    OffloadOptions probe;
    probe.chunk_bytes = 16 << 10;
    OffloadOptions o = probe;
    o.mode = mode;
    o.nvme_dir = dir.path();
    // Device budget: a quarter of parameters + gradients + AdamW states.
    {
      auto m = tiny_model();
      Offload sizing(m->named_parameters(), probe);
      o.device_mem = sizing.model_state_bytes() / 4;
    }
    const Run r = run(data, &o);
    INFO("mode " << engine::offload::mode_name(mode) << "\n" << r.report);
    CHECK(r.losses == base.losses);
    CHECK(r.first_param == base.first_param);
    CHECK(r.state_bytes >= 4 * o.device_mem);
    CHECK(r.device.peak_bytes <= o.device_mem);  // the budget held at every moment
    CHECK(r.device.peak_bytes > 0);
    CHECK(r.device.moves_in > 0);  // chunks really moved
    CHECK(r.device.prefetches > 0);
    std::fprintf(stderr, "%s", r.report.c_str());
  }
}

TEST_CASE("everything on NVMe: parameters, gradients and AdamW states train bitwise in memory") {
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir);
  const Run base = run(data, nullptr);

  OffloadOptions o;
  o.chunk_bytes = 16 << 10;
  o.mode = Mode::kNvme;
  o.params = Mode::kNvme;
  o.nvme_dir = dir.path();
  {
    auto m = tiny_model();
    Offload sizing(m->named_parameters(), o);
    // A quarter of the model state on the device; host staging for a few moment chunks only.
    o.device_mem = sizing.model_state_bytes() / 4;
    o.host_mem = 6 * sizing.manager().chunk_bytes();
  }
  const Run r = run(data, &o);
  INFO(r.report);
  CHECK(r.losses == base.losses);
  CHECK(r.first_param == base.first_param);
  // Every list lives on NVMe: nothing is homed on the device or the host.
  CHECK(r.nvme.home_bytes >= r.state_bytes);
  CHECK(r.device.home_bytes == 0);
  CHECK(r.host.home_bytes == 0);
  // Peaks as the manager accounted them at every change, within the budgets given.
  CHECK(r.device.peak_bytes > 0);
  CHECK(r.device.peak_bytes <= o.device_mem);
  CHECK(r.host.peak_bytes > 0);
  CHECK(r.host.peak_bytes <= o.host_mem);
  CHECK(r.device.reserved_bytes <= o.device_mem);
  CHECK(r.host.reserved_bytes <= o.host_mem);
  // Parameters came from the file into the device cache, ahead of use along the trace.
  CHECK(r.device.prefetches > 0);
  CHECK(r.nvme.moves_out > 0);
  CHECK(r.nvme.moves_in > 0);
  CHECK(r.nvme.bytes_out > r.state_bytes);  // more than one pass over the state was read back
  CHECK(r.report.find("parameters and gradients homed on nvme") != std::string::npos);
  std::fprintf(stderr, "%s", r.report.c_str());

  OffloadOptions host = o;
  host.params = Mode::kHost;
  host.host_mem = 0;
  const Run h = run(data, &host);
  INFO(h.report);
  CHECK(h.losses == base.losses);
  CHECK(h.first_param == base.first_param);
  CHECK(h.host.home_bytes >= h.state_bytes / 2);  // parameters and gradients
  CHECK(h.device.home_bytes == 0);

  OffloadOptions cpu_update = o;
  cpu_update.host_update = true;
  auto m = tiny_model();
  CHECK_THROWS_WITH(Offload(m->named_parameters(), cpu_update),
                    Catch::Contains("--offload-params=nvme"));
  OffloadOptions no_dir;
  no_dir.params = Mode::kNvme;
  CHECK_THROWS_WITH(Offload(m->named_parameters(), no_dir), Catch::Contains("--nvme-dir"));
}

// gpt2 at 1/8 of its model state in miniature: the token table (tied to the LM head) fits the
// device budget, but not beside its gradient, so no chunk may hold it whole. It spans chunks:
// the kernels that read it whole (lookup, LM head, their backward, the gradient copy) get its
// pieces in consecutive slots, the update pages piece by piece.
TEST_CASE("a token table too big for the budget beside its gradient spans chunks, bitwise") {
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir);
  constexpr int64_t kVocab = 4096;  // 4096 x 128 floats: 2 MiB, ~40% of the parameters
  const Run base = run(data, nullptr, kVocab);
  REQUIRE(base.losses.back() < base.losses.front());
  const auto model = tiny_model(kVocab);
  const engine::Tensor wte = model->named_parameters().front().second;
  REQUIRE(model->named_parameters().front().first == "wte.weight");
  const int64_t table = static_cast<int64_t>(wte.nbytes());
  const int64_t state = engine::offload::model_state_bytes(model->named_parameters());
  const int64_t budget = state / 8;
  REQUIRE(table <= budget);
  REQUIRE(2 * table > budget);  // the table and its gradient do not fit together

  OffloadOptions nvme;
  nvme.chunk_bytes = 256 << 10;  // the table spans 8 chunks
  nvme.mode = Mode::kNvme;
  nvme.params = Mode::kNvme;
  nvme.nvme_dir = dir.path();
  nvme.device_mem = budget;
  nvme.host_mem = 12 * nvme.chunk_bytes;
  OffloadOptions paged = nvme;  // AdamW on the device: four lists paged through host homes
  paged.mode = Mode::kNone;
  paged.params = Mode::kNone;
  paged.host_mem = 0;
  OffloadOptions host_update = paged;  // the CPU AdamW on host copies (CUDA's flow)
  host_update.mode = Mode::kHost;
  host_update.host_update = true;
  for (const OffloadOptions* o : {&nvme, &paged, &host_update}) {
    const Run r = run(data, o, kVocab);
    INFO(r.report);
    CHECK(r.chunk_bytes == o->chunk_bytes);  // not raised to the table's size
    CHECK(r.report.find("span up to 8 chunks") != std::string::npos);
    CHECK(r.losses == base.losses);
    CHECK(r.first_param == base.first_param);  // the table itself
    // Measured by the manager at every change, within the budgets given.
    CHECK(r.device.peak_bytes > table);
    CHECK(r.device.peak_bytes <= o->device_mem);
    CHECK(r.device.reserved_bytes <= o->device_mem);
    if (o->host_mem > 0) {
      CHECK(r.host.peak_bytes <= o->host_mem);
      CHECK(r.host.reserved_bytes <= o->host_mem);
    }
    CHECK(r.device.home_bytes == 0);
    std::fprintf(stderr, "%s", r.report.c_str());
  }
  // Without spans (a chunk raised to the table's size) this budget is refused by name.
  OffloadOptions whole = nvme;
  whole.chunk_bytes = table;
  CHECK_THROWS_WITH(Offload(model->named_parameters(), whole),
                    Catch::Contains("--device-mem") && Catch::Contains("needs 2"));
  // Where the table and its gradient fit, chunks hold the table whole, as they always did.
  OffloadOptions roomy = nvme;
  roomy.device_mem = 2 * table + nvme.chunk_bytes;
  roomy.host_mem = 2 * table;
  const Offload sized(model->named_parameters(), roomy);
  CHECK(sized.manager().chunk_bytes() == table);
  CHECK(sized.report().find("raised") != std::string::npos);
  CHECK(sized.report().find("span") == std::string::npos);
}

TEST_CASE("the host-update flow (CUDA's host|nvme) pages and trains bitwise like the plain loop") {
  // What --offload=host|nvme does with CUDA parameters, on the CPU backend: parameters and
  // gradients homed on the host only, the CPU AdamW on their host copies (acquire_home), the
  // device caching them. Same kernels on the same bytes: the same numbers.
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir);
  const Run base = run(data, nullptr);
  for (Mode mode : {Mode::kHost, Mode::kNvme}) {
    for (const bool constrained : {false, true}) {
      OffloadOptions o;
      o.chunk_bytes = 16 << 10;
      o.mode = mode;
      o.nvme_dir = dir.path();
      o.host_update = true;
      if (constrained) {
        auto m = tiny_model();
        Offload sizing(m->named_parameters(), o);
        o.device_mem = sizing.model_state_bytes() / 4;
      }
      const Run r = run(data, &o);
      INFO("mode " << engine::offload::mode_name(mode) << (constrained ? ", 1/4 budget" : "")
                   << "\n"
                   << r.report);
      CHECK(r.losses == base.losses);
      CHECK(r.first_param == base.first_param);
      CHECK(r.report.find("updated there by the CPU AdamW") != std::string::npos);
      CHECK(r.device.home_bytes == 0);  // everything on the device is a cached copy
      CHECK(r.device.moves_in > 0);     // parameters loaded back after every update...
      CHECK(r.device.moves_out > 0);    // ...and gradients written back for the CPU AdamW
      CHECK(r.device.reserved_bytes == r.device.slots * r.chunk_bytes);
      if (constrained) {
        CHECK(r.state_bytes >= 4 * o.device_mem);
        CHECK(r.device.peak_bytes <= o.device_mem);
        CHECK(r.device.reserved_bytes <= o.device_mem);
      }
    }
  }
}

TEST_CASE("budgets too small for one update are clear errors naming the sizes") {
  auto m = tiny_model();
  OffloadOptions o;
  o.chunk_bytes = 256 << 10;  // the largest parameter's size: no parameter spans chunks
  o.device_mem = 20 << 10;    // no chunk; an update needs four
  CHECK_THROWS_WITH(Offload(m->named_parameters(), o), Catch::Contains("--device-mem 20.0 KiB") &&
                                                           Catch::Contains("needs 4") &&
                                                           Catch::Contains("--chunk-mb"));
  // With small chunks and a budget that cannot hold chunks of the largest parameter (a
  // 128 x 512 matrix), it spans 16 of them, all resident at once beside one more.
  OffloadOptions s = o;
  s.chunk_bytes = 16 << 10;
  s.device_mem = 10 * s.chunk_bytes;
  CHECK_THROWS_WITH(Offload(m->named_parameters(), s),
                    Catch::Contains("--device-mem 160.0 KiB holds 10 chunk(s)") &&
                        Catch::Contains("spanning 16 chunks") &&
                        Catch::Contains("at least 272.0 KiB"));
  OffloadOptions h;
  h.chunk_bytes = 256 << 10;
  h.mode = Mode::kHost;
  h.host_mem = 8 << 10;
  CHECK_THROWS_WITH(Offload(m->named_parameters(), h),
                    Catch::Contains("--host-mem 8.0 KiB") && Catch::Contains("exp_avg"));
  OffloadOptions n;
  n.mode = Mode::kNvme;
  CHECK_THROWS_WITH(Offload(m->named_parameters(), n), Catch::Contains("--nvme-dir"));
  // A failed construction leaves the model usable with its own storage.
  CHECK(m->named_parameters().front().second.storage()->ensure_resident == nullptr);
}

namespace {

// Registers its layers in the reverse of the order its forward uses them: the head first, the
// embedding last.
class Shuffled final : public engine::nn::Module {
 public:
  Shuffled() {
    head_ = register_module("head", std::make_shared<engine::nn::Linear>(32, 48));
    norm_ = register_module("norm", std::make_shared<engine::nn::LayerNorm>(32));
    mid_ = register_module("mid", std::make_shared<engine::nn::Linear>(32, 32));
    emb_ = register_module("emb", std::make_shared<engine::nn::Embedding>(48, 32));
    init(5);
  }
  engine::Tensor loss(const engine::Tensor& in, const engine::Tensor& tg) const {
    const engine::Tensor h = norm_->forward(engine::gelu(mid_->forward(emb_->forward(in))));
    return engine::cross_entropy(head_->forward(h), tg);
  }

 private:
  std::shared_ptr<engine::nn::Linear> head_, mid_;
  std::shared_ptr<engine::nn::LayerNorm> norm_;
  std::shared_ptr<engine::nn::Embedding> emb_;
};

struct ShuffledRun {
  std::vector<double> losses;
  std::vector<double> head_weight;
  std::vector<int> chunk_of;  // per parameter (registration order)
  memory::chunks::TierStats device;
};

ShuffledRun run_shuffled(const std::string& data_path, const OffloadOptions* offload) {
  Shuffled model;
  const auto data = data::TokenDataset::open(data_path);
  engine::train::TrainOptions o = options();
  o.eval_every = 0;
  std::unique_ptr<Offload> off;
  if (offload) {
    off = std::make_unique<Offload>(model.named_parameters(), *offload);
    o.offload = off.get();
  }
  ShuffledRun r;
  r.losses =
      engine::train::train(
          model,
          [&](const engine::Tensor& in, const engine::Tensor& tg) { return model.loss(in, tg); },
          data, data::TokenDataset(), o, json::Value::object())
          .losses;
  if (off) {
    r.chunk_of = off->chunk_of_params();
    off->manager().synchronize();
    r.device = off->manager().stats(Tier::kDevice);
    off.reset();
  }
  r.head_weight = model.named_parameters().front().second.to_vector();
  return r;
}

}  // namespace

TEST_CASE("chunks are packed in the order the forward first uses the parameters") {
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir);
  const ShuffledRun base = run_shuffled(data, nullptr);
  REQUIRE(base.losses.size() == 10);

  Shuffled probe;
  const auto params = probe.named_parameters();
  REQUIRE(params.front().first == "head.weight");
  const auto order = engine::offload::first_use_order(params, [&] {
    const engine::Tensor ids = engine::Tensor::zeros({1, 4}, DType::kI64);
    probe.loss(ids, ids);
  });
  // Layer by layer as the forward runs them (a layer's weight and bias in the order its kernel
  // takes them): emb, mid, norm, head.
  REQUIRE(order.size() == params.size());
  auto layer_at = [&](size_t k) { return order[k].substr(0, order[k].find('.')); };
  std::vector<std::string> layers;
  for (size_t k = 0; k < order.size(); ++k) {
    if (layers.empty() || layers.back() != layer_at(k)) layers.push_back(layer_at(k));
  }
  CHECK(layers == std::vector<std::string>{"emb", "mid", "norm", "head"});
  // The probe's own hooks are gone again.
  for (const auto& [name, p] : params) CHECK(p.storage()->ensure_resident == nullptr);

  // 8 KiB chunks: emb (6 KiB), mid (4 KiB), head (6 KiB) cannot share one.
  OffloadOptions o;
  o.chunk_bytes = 8 << 10;
  o.mode = Mode::kHost;
  o.use_order = order;
  {
    Shuffled m;
    Offload sizing(m.named_parameters(), o);
    o.device_mem = 4 * sizing.manager().chunk_bytes();
  }
  // Chunk indices along `names` (parameter names) never decrease: packed in that order.
  auto index_of = [&](const std::string& name) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].first == name) return i;
    }
    FAIL("no parameter " << name);
    return size_t{0};
  };
  auto packed_along = [&](const std::vector<int>& chunk_of, const std::vector<std::string>& names) {
    for (size_t k = 1; k < names.size(); ++k) {
      if (chunk_of[index_of(names[k])] < chunk_of[index_of(names[k - 1])]) return false;
    }
    return true;
  };
  std::vector<std::string> registration;
  for (const auto& [name, p] : params) registration.push_back(name);

  const ShuffledRun used = run_shuffled(data, &o);
  INFO("chunks of head.weight, head.bias, norm.*, mid.*, emb.weight: "
       << ::Catch::Detail::stringify(used.chunk_of));
  CHECK(packed_along(used.chunk_of, order));
  CHECK(used.chunk_of[index_of("emb.weight")] == 0);
  CHECK(used.chunk_of[index_of("head.weight")] == 2);  // the last chunk
  CHECK(used.losses == base.losses);
  CHECK(used.head_weight == base.head_weight);
  CHECK(used.device.peak_bytes <= o.device_mem);
  CHECK(used.device.moves_in > 0);  // it paged: 6 chunks of params and grads, room for 4

  // Without the order: the model's order (head first, emb last).
  OffloadOptions plain = o;
  plain.use_order.clear();
  const ShuffledRun registered = run_shuffled(data, &plain);
  CHECK(packed_along(registered.chunk_of, registration));
  CHECK(registered.chunk_of[index_of("head.weight")] == 0);
  CHECK(registered.chunk_of[index_of("emb.weight")] == 2);
  CHECK(registered.losses == base.losses);
}

TEST_CASE("--device-mem auto: the first step's traced peak sets the chunks' budget") {
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir);
  const Run base = run(data, nullptr);

  OffloadOptions o;
  o.chunk_bytes = 16 << 10;
  o.auto_device_size = 64 << 20;  // room for everything once the activations are known
  const Run roomy = run(data, &o);
  INFO(roomy.report);
  const Offload::AutoBudget& a = roomy.auto_budget;
  CHECK(roomy.losses == base.losses);
  CHECK(roomy.first_param == base.first_param);
  CHECK(a.device_size == o.auto_device_size);
  CHECK(a.traced_peak > 0);
  CHECK(a.margin == a.traced_peak / engine::offload::kAutoMarginDivisor);
  CHECK(a.chunk_budget == a.device_size - a.traced_peak - a.margin);
  CHECK(roomy.device.budget == a.chunk_budget);
  CHECK(roomy.device.peak_bytes <= a.chunk_budget);  // chunk usage within the chosen budget
  CHECK(roomy.report.find("traced peak of non-chunk memory") != std::string::npos);

  // A device whose chunk share is about a quarter of the model's state: it pages from step 2.
  OffloadOptions tight = o;
  tight.auto_device_size = a.traced_peak + a.margin + roomy.state_bytes / 4;
  const Run small = run(data, &tight);
  INFO(small.report);
  const Offload::AutoBudget& b = small.auto_budget;
  CHECK(small.losses == base.losses);
  CHECK(small.first_param == base.first_param);
  CHECK(b.chunk_budget == b.device_size - b.traced_peak - b.margin);
  CHECK(b.chunk_budget < small.state_bytes / 2);
  CHECK(small.device.budget == b.chunk_budget);
  CHECK(small.device.peak_bytes <= b.chunk_budget);
  CHECK(small.device.moves_in > 0);

  // Too small for the activations plus one update's chunks: a clear error after step 1.
  OffloadOptions cramped = o;
  cramped.auto_device_size = a.traced_peak;
  CHECK_THROWS_WITH(run(data, &cramped), Catch::Contains("traced peak of non-chunk memory") &&
                                             Catch::Contains("--device-mem auto:"));
}
