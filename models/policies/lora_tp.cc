#include "models/policies/lora_tp.h"

#include "engine/autograd.h"
#include "engine/ops.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mammoth::models {

using engine::Tensor;

TpLora::TpLora(const LoraAdapters& full, ShardedLanguageModel& sharded)
    : tp_(sharded.mesh().group(parallel::Axis::kTp)),
      sp_(sharded.mesh().group(parallel::Axis::kSp)) {
  const LoraOptions& o = full.options();
  MAMMOTH_CHECK(o.dropout == 0)
      << "[lora] --lora-dropout " << o.dropout
      << " with --tp / --sp is not supported (a split input's dropout mask would differ from "
         "one process's); use --lora-dropout 0 or --dp";
  // The sharded base is frozen as the model is: no gradient buffers, no optimizer states.
  for (auto& [name, t] : sharded.named_parameters()) t.requires_grad_(false);
  std::map<std::string, std::shared_ptr<engine::nn::Module>> modules;
  for (auto& [name, m] : sharded.named_modules()) modules[name] = m;
  const int p = tp_.size(), r = tp_.rank();
  engine::NoGradGuard ng;
  for (const LoraAdapters::Target& t : full.targets()) {
    const std::string module = t.param.substr(0, t.param.size() - std::string(".weight").size());
    auto it = modules.find(module);
    MAMMOTH_CHECK(it != modules.end())
        << "[lora] '" << t.path << "' has no layer in the tensor-parallel form of the model";
    MAMMOTH_CHECK(sharded.spec(t.param).sharded() || sharded.holds_full(t.param))
        << "[lora] '" << t.path << "' holds one replicated KV head per tp rank (fewer KV heads "
        << "than --tp); LoRA on it under --tp is not supported: target other modules or lower --tp";
    const Tensor a = t.lora->lora_a(), b = t.lora->lora_b();
    const std::string name_a = module + ".lora_A.weight", name_b = module + ".lora_B.weight";
    parallel::ShardSpec spec_a, spec_b;  // replicated unless set
    std::shared_ptr<LoraLinear> local;
    if (auto col = std::dynamic_pointer_cast<parallel::ColumnParallelLinear>(it->second)) {
      spec_b = col->weight_spec();
      local = std::make_shared<LoraLinear>(a.size(1), col->weight.size(0), o, a.dtype());
      col->delta = local;
    } else if (auto row = std::dynamic_pointer_cast<parallel::RowParallelLinear>(it->second)) {
      spec_a = row->weight_spec();
      local = std::make_shared<LoraLinear>(row->weight.size(1), b.size(0), o, a.dtype());
      row->delta = local;
    } else if (auto lin = std::dynamic_pointer_cast<engine::nn::Linear>(it->second)) {
      // A layer the policy keeps whole: the adapter stays whole too.
      local = std::make_shared<LoraLinear>(a.size(1), b.size(0), o, a.dtype());
      lin->delta = local;
    } else {
      MAMMOTH_CHECK(false) << "[lora] '" << t.path
                           << "' is not a linear layer in the tensor-parallel form of the model";
    }
    // Built on the host (the caller moves parameters() to its device).
    const Tensor la = local->lora_a(), lb = local->lora_b();
    engine::copy_(la, parallel::shard_tensor(a.detach().to(Device::cpu()), spec_a, r, p));
    engine::copy_(lb, parallel::shard_tensor(b.detach().to(Device::cpu()), spec_b, r, p));
    local_.emplace_back(name_a, la);
    local_.emplace_back(name_b, lb);
    whole_.emplace_back(name_a, a);
    whole_.emplace_back(name_b, b);
    specs_[name_a] = spec_a;
    specs_[name_b] = spec_b;
    loras_.push_back(std::move(local));
  }
}

parallel::ShardSpec TpLora::spec(const std::string& name) const {
  auto it = specs_.find(name);
  MAMMOTH_CHECK(it != specs_.end()) << "[lora] no adapter tensor '" << name << "'";
  return it->second;
}

void TpLora::sync_grad(const std::string& name, const Tensor& t) const {
  Tensor g = t.grad();
  if (!g.defined()) return;
  bool changed = false;
  if (!spec(name).sharded() && tp_.size() > 1) {
    g = parallel::comm_ops::all_reduce(g, tp_);
    changed = true;
  }
  if (sp_.size() > 1) {
    g = parallel::comm_ops::all_reduce(g, sp_);
    changed = true;
  }
  if (changed) t.set_grad(g);
}

void TpLora::sync_grads() const {
  for (const auto& [name, t] : local_) sync_grad(name, t);
}

bool TpLora::grad_owner(const std::string& name) const {
  return spec(name).sharded() || tp_.rank() == 0;
}

engine::nn::NamedTensors TpLora::full_parameters() const {
  engine::nn::NamedTensors out;
  for (const auto& [name, t] : local_) {
    out.emplace_back(name, parallel::unshard_tensor(t, spec(name), tp_));
  }
  return out;
}

}  // namespace mammoth::models
