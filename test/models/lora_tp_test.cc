// LoRA under tensor parallelism (models/policies/lora_tp.h), on 2 ranks: the sharded model with
// the adapters' pieces computes what the single-process model with the whole adapters computes
// (GPT-2's fused c_attn splits B by q|k|v segment), training through the real loop leaves the
// sharded base bitwise equal to the model it came from with no gradient buffers, the
// replicated factors stay bitwise equal on every rank, and the gathered adapters moved.
#include "models/policies/lora_tp.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/train/trainer.h"
#include "models/lora.h"
#include "models/registry.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/mesh.h"
#include "test/testing/test_dir.h"
#include "test/testing/token_data.h"

using namespace mammoth;
using engine::Tensor;

namespace {

std::shared_ptr<models::LanguageModel> tiny(const std::string& name) {
  models::ModelOptions mo;
  mo.vocab_size = 48;
  mo.max_seq = 16;
  mo.seed = 5;
  mo.announce = false;
  return models::create_language_model(name, mo);
}

// Column- and row-parallel targets of both kinds (LLaMA: GQA's k/v split over tp).
std::vector<std::string> targets_for(const std::string& name) {
  return name == "gpt2-tiny" ? std::vector<std::string>{"c_attn", "c_proj", "c_fc"}
                             : std::vector<std::string>{"q_proj", "k_proj",  "v_proj",
                                                        "o_proj", "up_proj", "down_proj"};
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

double max_rel(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return diff / std::max(scale, 1e-30);
}

// The same tensor on every rank of `group`: its maximum and its negation's maximum over the
// group are itself, bit for bit.
bool same_on_every_rank(const Tensor& t, parallel::Communicator& group) {
  Tensor hi = t.detach().contiguous().clone(), lo = (t.detach() * -1.0).contiguous();
  group.all_reduce(hi, parallel::ReduceOp::kMax);
  group.all_reduce(lo, parallel::ReduceOp::kMax);
  return bitwise_equal(hi, t.detach()) && bitwise_equal(lo * -1.0, t.detach());
}

Tensor ids() {
  std::vector<int64_t> v;
  for (int i = 0; i < 24; ++i) v.push_back((i * 5 + 3) % 48);
  return Tensor::from_ints(v, {2, 12});
}

}  // namespace

TEST_CASE("LoRA under tp 2: one process's function, a frozen sharded base, equal copies") {
  parallel::DeviceMesh mesh(parallel::mpi_world(), {.tp = 2});
  REQUIRE(mesh.size(parallel::Axis::kTp) == 2);
  parallel::Communicator& tp = mesh.group(parallel::Axis::kTp);
  for (const std::string name : {"gpt2-tiny", "llama-tiny"}) {
    INFO(name);
    auto model = tiny(name);
    model->eval();
    engine::nn::NamedTensors before;
    for (const auto& [n, p] : model->named_parameters()) before.emplace_back(n, p.clone());
    auto lora = models::apply_lora(
        *model, {.rank = 4, .alpha = 8, .targets = targets_for(name), .seed = 2});
    {
      // B away from zero, so that the adapters change the function.
      engine::NoGradGuard ng;
      uint64_t stream = 1;
      for (const auto& t : lora->targets()) {
        engine::copy_(t.lora->lora_b(),
                      Tensor::randn(t.lora->lora_b().shape(), 9, 0.0, 0.05, DType::kF32, stream++));
      }
    }
    auto sharded = models::apply_policy(*model, mesh);
    models::TpLora tl(*lora, *sharded);
    REQUIRE(tl.parameters().size() == 2 * lora->targets().size());
    sharded->eval();
    {
      engine::NoGradGuard ng;
      const Tensor want = model->forward(ids()), base = [&] {
        models::detach_lora(*lora);
        Tensor b = model->forward(ids());
        return b;
      }();
      const Tensor got = sharded->forward(ids());
      CHECK(max_rel(want, base) > 1e-3);  // the adapters matter
      CHECK(max_rel(got, want) < 1e-5);
    }
    // A split B holds its rows' share; the replicated factors are whole.
    for (const auto& [n, t] : tl.parameters()) {
      INFO(n);
      const auto& whole = tl.single_process_parameters();
      auto it =
          std::find_if(whole.begin(), whole.end(), [&](const auto& w) { return w.first == n; });
      REQUIRE(it != whole.end());
      if (tl.spec(n).sharded()) {
        CHECK(t.numel() * 2 == it->second.numel());
      } else {
        CHECK(t.shape() == it->second.shape());
      }
    }

    sharded->train(true);
    testing::TestDir dir;
    engine::train::TrainOptions o;
    o.steps = 4;
    o.micro_batch = 4;
    o.seq_len = 12;
    o.lr = 1e-2;
    o.warmup = 1;
    o.eval_every = 0;
    o.quiet = true;
    o.weight_decay = 0.1;  // decay must not reach the frozen base
    o.grad_clip = 0;       // the local norm would differ between ranks (no tp reduction here)
    o.trained_params = &tl.parameters();
    o.after_backward = [&tl] { tl.sync_grads(); };
    const auto data = data::TokenDataset::open(testing::write_tiny_tokens(dir));
    const auto r = engine::train::train(
        *sharded, [&](const Tensor& in, const Tensor& tg) { return sharded->loss(in, tg); }, data,
        data::TokenDataset(), o, json::Value::object());
    REQUIRE(r.losses.size() == 4);
    for (const auto& [n, p] : sharded->named_parameters()) {
      INFO(n);
      CHECK_FALSE(p.requires_grad());
      CHECK_FALSE(p.grad().defined());  // no gradient buffer was ever made
    }
    const engine::nn::NamedTensors after = sharded->full_parameters();
    REQUIRE(after.size() == before.size());
    for (size_t i = 0; i < after.size(); ++i) {
      INFO(after[i].first);
      REQUIRE(after[i].first == before[i].first);
      CHECK(bitwise_equal(after[i].second, before[i].second));
    }
    const engine::nn::NamedTensors trained = tl.full_parameters();
    for (const auto& [n, t] : tl.parameters()) {
      INFO(n);
      if (!tl.spec(n).sharded()) CHECK(same_on_every_rank(t, tp));
    }
    for (size_t i = 0; i < trained.size(); ++i) {
      INFO(trained[i].first);
      CHECK(trained[i].first == tl.single_process_parameters()[i].first);
      CHECK_FALSE(bitwise_equal(trained[i].second, tl.single_process_parameters()[i].second));
    }
  }
}
