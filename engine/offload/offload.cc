#include "engine/offload/offload.h"

#include <cstring>
#include <unordered_set>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/params.h"
#include "kernels/registry.h"

namespace mammoth::engine::offload {

namespace chunks = memory::chunks;
using chunks::Tier;

Mode parse_mode(const std::string& text) {
  if (text == "none") return Mode::kNone;
  if (text == "host") return Mode::kHost;
  if (text == "nvme") return Mode::kNvme;
  MAMMOTH_THROW() << "[train] --offload must be none, host or nvme, got '" << text << "'";
}

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::kNone:
      return "none";
    case Mode::kHost:
      return "host";
    case Mode::kNvme:
      return "nvme";
  }
  return "?";
}

namespace {

// Pages a tensor's chunk in (no-op for ordinary storage) before its address is taken.
void make_resident(const Tensor& t, bool write) {
  if (t.defined() && t.storage()->ensure_resident) t.storage()->ensure_resident(write);
}

constexpr int64_t kSlotAlignment = 64;  // as memory::CpuAllocator: same SIMD alignment

}  // namespace

// AdamW over the chunked parameters: PyTorch's update through the same fused kernel as
// optim::AdamW, launched per parameter on the same slices, so the numbers are identical; the
// difference is that each launch first pages in its four chunks (parameter, gradient, moments).
class Offload::ChunkedAdamW final : public optim::Optimizer {
 public:
  ChunkedAdamW(Offload& owner, const optim::AdamWOptions& options)
      : Optimizer(owner.params_), owner_(owner), options_(options) {
    MAMMOTH_CHECK(options.lr >= 0) << "[AdamW] lr must be >= 0, got " << options.lr;
    lr_ = options.lr;
    for (const auto& [name, t] : params_) decay_.push_back(optim::decay_matrices(name, t));
  }

  void step(double grad_scale) override {
    NoGradGuard ng;
    ++step_count_;
    kernels::AdamWParams p;
    p.lr = lr_;
    p.beta1 = options_.beta1;
    p.beta2 = options_.beta2;
    p.eps = options_.eps;
    p.step = step_count_;
    p.grad_scale = grad_scale;
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& [name, param] = params_[i];
      Tensor g = param.grad();
      if (!g.defined()) continue;
      MAMMOTH_CHECK(g.shape() == param.shape() && g.dtype() == param.dtype())
          << "[optimizer] gradient of '" << name << "' has shape " << shape_str(g.shape()) << " "
          << dtype_name(g.dtype()) << " but the parameter is " << shape_str(param.shape()) << " "
          << dtype_name(param.dtype());
      if (!g.is_contiguous()) g = g.contiguous();
      const Tensor m = owner_.view(kExpAvg, i), v = owner_.view(kExpAvgSq, i);
      make_resident(param, true);
      make_resident(g, false);
      make_resident(m, true);
      make_resident(v, true);
      p.weight_decay = decay_[i] ? options_.weight_decay : 0.0;
      std::vector<kernels::TensorArg> args = {param.arg(), g.arg(), m.arg(), v.arg()};
      kernels::launch(kernels::Kernel::adamw, param.device().type, param.dtype(), args, {}, &p);
    }
  }

  nn::NamedTensors state() const override {
    nn::NamedTensors out;
    for (size_t i = 0; i < params_.size(); ++i) {
      out.emplace_back(params_[i].first + ".exp_avg", owner_.view(kExpAvg, i));
      out.emplace_back(params_[i].first + ".exp_avg_sq", owner_.view(kExpAvgSq, i));
    }
    return out;
  }

 private:
  Offload& owner_;
  optim::AdamWOptions options_;
  std::vector<bool> decay_;
};

Offload::Offload(const nn::NamedTensors& params, const OffloadOptions& options)
    : options_(options) {
  // Unique parameters (tied weights once), in the model's order: the order of first use in
  // the forward pass for the zoo's models, so chunks fill in the order they are needed.
  std::unordered_set<TensorImpl*> seen;
  int64_t largest = 0;
  for (const auto& [name, p] : params) {
    if (!seen.insert(p.impl()).second) continue;
    MAMMOTH_CHECK(p.device().type == DeviceType::kCPU)
        << "[offload] parameter '" << name << "' is on " << p.device()
        << ": chunked offload runs on the CPU backend only so far";
    MAMMOTH_CHECK(p.is_contiguous() && is_floating(p.dtype()))
        << "[offload] parameter '" << name << "' must be a contiguous floating-point tensor";
    params_.emplace_back(name, p);
    largest = std::max<int64_t>(largest, static_cast<int64_t>(p.nbytes()));
    state_bytes_ += 4 * static_cast<int64_t>(p.nbytes());
  }
  MAMMOTH_CHECK(!params_.empty()) << "[offload] the model has no parameters";
  requested_chunk_bytes_ = options.chunk_bytes;
  // A parameter never straddles chunks (kernels need it contiguous), so a chunk holds the
  // largest one.
  const int64_t chunk_bytes = std::max(options.chunk_bytes, largest);

  chunks::ChunkManagerOptions mo;
  mo.chunk_bytes = chunk_bytes;
  mo.device_budget = options.device_mem;
  mo.host_budget = options.host_mem;
  mo.nvme_dir = options.nvme_dir;
  mo.io = options.io;
  mo.prefetch_depth = options.prefetch_depth;
  MAMMOTH_CHECK(options.mode != Mode::kNvme || !options.nvme_dir.empty())
      << "[train] --offload=nvme needs --nvme-dir";
  manager_ = std::make_unique<chunks::ChunkManager>(mo);
  const int64_t cb = manager_->chunk_bytes();

  // Layout: first fit in order.
  std::vector<int64_t> chunk_used;
  for (const auto& [name, p] : params_) {
    const int64_t n = static_cast<int64_t>(p.nbytes());
    int64_t at = chunk_used.empty() ? cb + 1
                                    : (chunk_used.back() + kSlotAlignment - 1) / kSlotAlignment *
                                          kSlotAlignment;
    if (chunk_used.empty() || at + n > cb) {
      chunk_used.push_back(0);
      at = 0;
    }
    slots_.push_back(Slot{static_cast<int>(chunk_used.size()) - 1, at});
    chunk_used.back() = at + n;
  }

  const std::vector<Tier> device_first = {Tier::kDevice, Tier::kHost};
  const chunks::ChunkListSpec specs[kNumLists] = {
      {"params", Tier::kDevice, device_first, "param"},
      {"grads", Tier::kDevice, device_first, "grad"},
      options.mode == Mode::kNone
          ? chunks::ChunkListSpec{"exp_avg", Tier::kDevice, device_first, "exp_avg"}
          : chunks::ChunkListSpec{"exp_avg", Tier::kHost,
                                  {options.mode == Mode::kHost ? Tier::kHost : Tier::kNvme},
                                  "exp_avg"},
      options.mode == Mode::kNone
          ? chunks::ChunkListSpec{"exp_avg_sq", Tier::kDevice, device_first, "exp_avg_sq"}
          : chunks::ChunkListSpec{"exp_avg_sq", Tier::kHost,
                                  {options.mode == Mode::kHost ? Tier::kHost : Tier::kNvme},
                                  "exp_avg_sq"},
  };
  for (int l = 0; l < kNumLists; ++l) {
    const int list = manager_->add_list(specs[l]);
    for (int64_t used : chunk_used) ids_[l].push_back(manager_->add_chunk(list, used));
  }
  manager_->finalize();

  // One Storage per chunk, shared by every tensor in it; the manager points it at wherever the
  // chunk's bytes are, and kernel launches page it in through the hook.
  chunks::ChunkManager* mgr = manager_.get();
  for (int l = 0; l < kNumLists; ++l) {
    for (chunks::ChunkId id : ids_[l]) {
      auto st = std::make_shared<Storage>(nullptr, static_cast<size_t>(cb), Device::cpu(),
                                          [] {});
      Storage* raw = st.get();
      st->ensure_resident = [mgr, id](bool write) { mgr->acquire(id, write); };
      manager_->set_observer(id, [raw](void* p) { raw->data = p; });
      storages_[l].push_back(std::move(st));
    }
  }

  // Move the parameter values in, chunk by chunk (each acquire may evict the previous chunk).
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].second;
    const Slot& s = slots_[i];
    char* base = static_cast<char*>(manager_->acquire(ids_[kParams][s.chunk], true));
    std::memcpy(base + s.offset, p.raw_data(), p.nbytes());
    TensorImpl* impl = p.impl();
    impl->storage = storages_[kParams][s.chunk];
    impl->offset = s.offset / static_cast<int64_t>(dtype_size(p.dtype()));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    grad_views_.push_back(view(kGrads, i));
    set_grad_ready_hook(params_[i].second, [this, i] { on_grad_ready(i); });
  }
  manager_->restart_trace();  // the trace is the first training step's, not this set-up
}

Offload::~Offload() {
  // Copy the values back into ordinary storage so the model outlives this object.
  try {
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor& p = params_[i].second;
      make_resident(p, false);
      Tensor own = Tensor::empty(p.shape(), p.dtype());
      std::memcpy(own.raw_data(), p.raw_data(), p.nbytes());
      TensorImpl* impl = p.impl();
      impl->storage = own.storage();
      impl->offset = 0;
      impl->grad = Tensor();
      impl->grad_ready_hook = nullptr;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[offload] restoring parameters failed: %s\n", e.what());
  }
  for (auto& list : storages_) {
    for (auto& st : list) {
      st->ensure_resident = nullptr;
      st->data = nullptr;  // views that outlive the manager fail loudly, never read freed bytes
    }
  }
  optimizer_.reset();
}

Tensor Offload::view(List list, size_t i) const {
  const Tensor& p = params_[i].second;
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storages_[list][slots_[i].chunk];
  impl->offset = slots_[i].offset / static_cast<int64_t>(dtype_size(p.dtype()));
  impl->shape = p.shape();
  impl->strides = contiguous_strides(p.shape());
  impl->dtype = p.dtype();
  return Tensor(std::move(impl));
}

void Offload::on_grad_ready(size_t i) {
  TensorImpl* impl = params_[i].second.impl();
  const Tensor g = impl->grad;
  const Tensor& dst = grad_views_[i];
  if (!g.defined() || g.impl() == dst.impl()) return;
  MAMMOTH_CHECK(g.shape() == dst.shape() && g.dtype() == dst.dtype())
      << "[offload] gradient of '" << params_[i].first << "' has shape " << shape_str(g.shape())
      << " " << dtype_name(g.dtype()) << " but the parameter is " << shape_str(dst.shape()) << " "
      << dtype_name(dst.dtype());
  NoGradGuard ng;
  make_resident(g, false);
  make_resident(dst, true);
  copy_(dst, g);
  impl->grad = dst;
}

optim::Optimizer& Offload::optimizer(const optim::AdamWOptions& options) {
  if (!optimizer_) optimizer_ = std::make_unique<ChunkedAdamW>(*this, options);
  return *optimizer_;
}

void Offload::end_step() {
  // The step's gradients are consumed (or the step was skipped): never write them back.
  for (chunks::ChunkId id : ids_[kGrads]) manager_->discard(id);
  manager_->end_step();
}

nn::NamedTensors Offload::gather_state() {
  NoGradGuard ng;
  nn::NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (List l : {kExpAvg, kExpAvgSq}) {
      const Tensor v = view(l, i);
      make_resident(v, false);
      Tensor copy = Tensor::empty(v.shape(), v.dtype());
      copy_(copy, v);
      out.emplace_back(params_[i].first + (l == kExpAvg ? ".exp_avg" : ".exp_avg_sq"), copy);
    }
  }
  return out;
}

void Offload::scatter_state(const nn::NamedTensors& full) {
  NoGradGuard ng;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (List l : {kExpAvg, kExpAvgSq}) {
      const std::string name = params_[i].first + (l == kExpAvg ? ".exp_avg" : ".exp_avg_sq");
      const Tensor* src = nullptr;
      for (const auto& [n, t] : full) {
        if (n == name) src = &t;
      }
      MAMMOTH_CHECK(src != nullptr) << "[offload] optimizer state '" << name << "' is missing";
      const Tensor v = view(l, i);
      make_resident(v, true);
      copy_(v, *src);
    }
  }
}

json::Value Offload::metrics() const {
  json::Value out = json::Value::object();
  for (int t = 0; t < chunks::kNumTiers; ++t) {
    const chunks::TierStats& s = manager_->stats(static_cast<Tier>(t));
    json::Value v = json::Value::object();
    v.set("budget", json::Value(s.budget));
    v.set("home_bytes", json::Value(s.home_bytes));
    v.set("peak_bytes", json::Value(s.peak_bytes));
    v.set("moves_in", json::Value(s.moves_in));
    v.set("bytes_in", json::Value(s.bytes_in));
    v.set("moves_out", json::Value(s.moves_out));
    v.set("bytes_out", json::Value(s.bytes_out));
    v.set("stall_s", json::Value(s.stall_s));
    out.set(chunks::tier_name(static_cast<Tier>(t)), v);
  }
  return out;
}

std::string Offload::report() const {
  std::string out = "[offload] --offload=" + std::string(mode_name(options_.mode)) + ": " +
                    std::to_string(params_.size()) + " parameters, parameters + gradients + AdamW " +
                    "states " + chunks::short_bytes(state_bytes_);
  if (manager_->chunk_bytes() > requested_chunk_bytes_)
    out += "; chunks raised from " + chunks::short_bytes(requested_chunk_bytes_) +
           " to the largest parameter";
  return out + "\n" + manager_->report();
}

}  // namespace mammoth::engine::offload
