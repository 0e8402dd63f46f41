#include "models/policies/policy.h"

#include <set>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mammoth::models {

using engine::Tensor;

const char* sp_mode_name(SpMode mode) {
  switch (mode) {
    case SpMode::kNone:
      return "none";
    case SpMode::kSplitGather:
      return "split_gather";
    case SpMode::kUlysses:
      return "ulysses";
    case SpMode::kRing:
      return "ring";
  }
  return "?";
}

SpMode sp_mode_from_name(const std::string& name) {
  for (SpMode m : {SpMode::kNone, SpMode::kSplitGather, SpMode::kUlysses, SpMode::kRing}) {
    if (name == sp_mode_name(m)) return m;
  }
  MAMMOTH_THROW() << "[sp_mode] unknown sequence parallel mode '" << name
                  << "'; expected none, split_gather, ulysses or ring";
}

ShardedLanguageModel::ShardedLanguageModel(const parallel::DeviceMesh& mesh,
                                           const ShardOptions& options)
    : mesh_(mesh), options_(options) {
  const int sp = mesh.size(parallel::Axis::kSp);
  const bool sp_mode = options.sp_mode == SpMode::kUlysses || options.sp_mode == SpMode::kRing;
  MAMMOTH_CHECK(sp == 1 || sp_mode)
      << "[apply_policy] the mesh has sp=" << sp << " but --sp-mode is "
      << sp_mode_name(options.sp_mode) << "; use ulysses or ring (split_gather runs on tp)";
}

parallel::ShardSpec ShardedLanguageModel::spec(const std::string& name) const {
  auto it = specs_.find(name);
  return it == specs_.end() ? parallel::ShardSpec{} : it->second;
}

void ShardedLanguageModel::load_from(const Model& full) {
  parallel::Communicator& tp = mesh_.group(parallel::Axis::kTp);
  std::map<std::string, Tensor> mine;
  for (const auto& [name, t] : named_parameters()) mine[name] = t;
  std::set<std::string> seen;
  engine::NoGradGuard ng;
  for (const auto& [name, t] : full.named_parameters()) {
    auto it = mine.find(name);
    MAMMOTH_CHECK(it != mine.end())
        << "[apply_policy] the sharded model has no parameter '" << name << "'";
    Tensor shard = parallel::shard_tensor(t, spec(name), tp.rank(), tp.size());
    MAMMOTH_CHECK(shard.shape() == it->second.shape())
        << "[apply_policy] shard of '" << name << "' is " << engine::shape_str(shard.shape())
        << ", the parameter " << engine::shape_str(it->second.shape());
    engine::copy_(it->second, shard);
    seen.insert(name);
  }
  MAMMOTH_CHECK(seen.size() == mine.size())
      << "[apply_policy] the sharded model has " << mine.size() << " parameters, the model "
      << seen.size();
}

engine::nn::NamedTensors ShardedLanguageModel::full_parameters() const {
  parallel::Communicator& tp = mesh_.group(parallel::Axis::kTp);
  engine::nn::NamedTensors out;
  for (const auto& [name, t] : named_parameters()) {
    out.emplace_back(name, parallel::unshard_tensor(t, spec(name), tp));
  }
  return out;
}

void ShardedLanguageModel::sync_grads() const {
  const bool split_gather = options_.sp_mode == SpMode::kSplitGather;
  parallel::Communicator& tp = mesh_.group(parallel::Axis::kTp);
  parallel::Communicator& sp = mesh_.group(parallel::Axis::kSp);
  for (const auto& [name, t] : named_parameters()) {
    Tensor g = t.grad();
    if (!g.defined()) g = Tensor::zeros(t.shape(), t.dtype(), t.device());
    bool changed = false;
    if (split_gather && tp.size() > 1 && !spec(name).sharded()) {
      g = parallel::comm_ops::all_reduce(g, tp);
      changed = true;
    }
    if (sp.size() > 1) {
      g = parallel::comm_ops::all_reduce(g, sp);
      changed = true;
    }
    if (changed) t.set_grad(g);
  }
}

std::shared_ptr<ShardedLanguageModel> apply_policy(const Model& model,
                                                   const parallel::DeviceMesh& mesh,
                                                   const ShardOptions& options) {
  switch (model.config().family) {
    case Family::kGpt2:
      return gpt2_policy(model, mesh, options);
    default:
      MAMMOTH_THROW() << "[apply_policy] no sharding policy for family '"
                      << family_name(model.config().family) << "' yet";
  }
}

}  // namespace mammoth::models
