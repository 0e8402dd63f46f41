#include "engine/offload/offload.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "memory/allocator.h"
#include "memory/chunks/layout.h"
#ifdef MAMMOTH_WITH_CUDA
#include "memory/cuda/device.h"
#endif

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

// n bytes between any two devices, in place when it returns (a memcpy between host buffers).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t n) {
#ifdef MAMMOTH_WITH_CUDA
  memory::cuda::copy_bytes(dst, dst_dev, src, src_dev, n);
#else
  MAMMOTH_CHECK(dst_dev.is_cpu() && src_dev.is_cpu())
      << "[offload] cannot copy from " << src_dev << " to " << dst_dev
      << ": this build has no CUDA backend";
  std::memcpy(dst, src, n);
#endif
}

// A contiguous tensor's kernel argument at `data` (a host copy of its chunk's bytes).
kernels::TensorArg arg_at(const Tensor& t, void* data) {
  kernels::TensorArg a;
  a.data = data;
  a.dtype = t.dtype();
  a.ndim = static_cast<int>(t.dim());
  const Shape strides = contiguous_strides(t.shape());
  for (int d = 0; d < a.ndim; ++d) {
    a.shape[d] = t.shape()[d];
    a.strides[d] = strides[d];
  }
  return a;
}

// A copy of `v` in host memory (checkpoints, gather_state); `v` must be resident.
Tensor host_copy(const Tensor& v) {
  Tensor copy = Tensor::empty(v.shape(), v.dtype(), v.device());
  copy_(copy, v);
  return copy.to(Device::cpu());  // no-op on the CPU backend
}

}  // namespace

int64_t model_state_bytes(const nn::NamedTensors& params) {
  std::unordered_set<TensorImpl*> seen;
  int64_t bytes = 0;
  for (const auto& [name, p] : params) {
    if (seen.insert(p.impl()).second) bytes += 4 * static_cast<int64_t>(p.nbytes());
  }
  return bytes;
}

std::vector<std::string> first_use_order(const nn::NamedTensors& params,
                                         const std::function<void()>& forward) {
  // Every kernel launch calls its arguments' residency hooks (engine/ops/common.h): a hook on
  // each parameter's storage sees the first launch that touches it. Storages shared by several
  // parameters (tied weights, views) record all of them at once.
  std::vector<std::pair<Storage*, std::vector<std::string>>> by_storage;
  for (const auto& [name, p] : params) {
    Storage* st = p.storage().get();
    auto it = std::find_if(by_storage.begin(), by_storage.end(),
                           [st](const auto& e) { return e.first == st; });
    if (it == by_storage.end()) {
      by_storage.push_back({st, {}});
      it = by_storage.end() - 1;
    }
    if (std::find(it->second.begin(), it->second.end(), name) == it->second.end())
      it->second.push_back(name);
  }
  std::vector<std::string> order;
  std::vector<std::function<void(bool)>> saved;
  for (auto& [st, names] : by_storage) {
    saved.push_back(st->ensure_resident);
    auto previous = st->ensure_resident;
    const std::vector<std::string>* list = &names;
    auto done = std::make_shared<bool>(false);
    st->ensure_resident = [&order, list, done, previous](bool write) {
      if (!*done) {
        *done = true;
        order.insert(order.end(), list->begin(), list->end());
      }
      if (previous) previous(write);
    };
  }
  auto restore = [&] {
    for (size_t s = 0; s < by_storage.size(); ++s) by_storage[s].first->ensure_resident = saved[s];
  };
  try {
    NoGradGuard ng;
    forward();
  } catch (...) {
    restore();
    throw;
  }
  restore();
  for (const auto& [name, p] : params) {
    if (std::find(order.begin(), order.end(), name) == order.end()) order.push_back(name);
  }
  return order;
}

// AdamW over the chunked parameters: optim::AdamW's update, launched per parameter on the same
// slices, so the numbers are identical; what differs is where the moments live (chunks, on any
// tier) and that each launch first pages in its four chunks (parameter, gradient, moments).
class Offload::ChunkedAdamW final : public optim::AdamW {
 public:
  ChunkedAdamW(Offload& owner, const optim::AdamWOptions& options)
      : AdamW(owner.params_, options, optim::decay_matrices, Moments::kExternal), owner_(owner) {}

  void step(double grad_scale) override {
    NoGradGuard ng;
    begin_step(grad_scale);
    // Chunk by chunk (parameters are independent, so the order changes no number): under dp
    // each updated chunk's broadcast starts at once, overlapping the rest of the walk, and the
    // other ranks' chunks are received meanwhile (Offload::publish; after_step waits).
    for (int k = 0; k < owner_.num_chunks(); ++k) {
      for (size_t i : owner_.chunk_members_[k]) update_param(i);
      if (owner_.dp_) owner_.publish(k);
    }
  }

  nn::NamedTensors state() const override;

 private:
  void update_param(size_t i) {
    const auto& [name, param] = params_[i];
    if (!owner_.owns(i)) return;  // another dp rank updates it and broadcasts the result
    const Tensor g = optim::checked_grad(name, param);
    if (!g.defined()) return;
    const Slot& slot = owner_.slots_[i];
    if (slot.pieces > 1) {
      // Elementwise, so piece by piece gives the same numbers (pieces are whole vectors, so no
      // element changes lanes) and only one piece of each list is resident at a time.
      MAMMOTH_CHECK(g.storage() == owner_.span_storages_[kGrads][i])
          << "[optimizer] gradient of '" << name << "' is not in its gradient chunks";
      for (int j = 0; j < slot.pieces; ++j) {
        const Tensor pj = owner_.piece(kParams, i, j), gj = owner_.piece(kGrads, i, j);
        update_slice(i, pj, gj, owner_.piece(kExpAvg, i, j), owner_.piece(kExpAvgSq, i, j),
                     slot.chunk + j, 0);
      }
      return;
    }
    const Tensor m = owner_.view(kExpAvg, i), v = owner_.view(kExpAvgSq, i);
    MAMMOTH_CHECK(!owner_.host_update_ || g.storage() == owner_.storages_[kGrads][slot.chunk])
        << "[optimizer] gradient of '" << name << "' is not in its gradient chunk";
    update_slice(i, param, g, m, v, slot.chunk, slot.offset);
  }

  // The update of `param` (all of parameter i, or a piece of it in chunk k at `offset` bytes).
  void update_slice(size_t i, const Tensor& param, const Tensor& g, const Tensor& m,
                    const Tensor& v, int k, int64_t offset) {
    if (owner_.host_update_) {
      // The CPU AdamW on the host copies (offload.h, "The device"): the gradient
      // chunk's home copy, written back from the device if dirty; the parameter chunk's home
      // copy, whose device copy is dropped, so the next forward loads the updated bytes.
      memory::chunks::ChunkManager& mgr = *owner_.manager_;
      char* pp = static_cast<char*>(mgr.acquire_home(owner_.ids_[kParams][k], true));
      char* gp = static_cast<char*>(mgr.acquire_home(owner_.ids_[kGrads][k], false));
      make_resident(m, true);
      make_resident(v, true);
      update(i, {arg_at(param, pp + offset), arg_at(g, gp + offset), m.arg(), v.arg()},
             DeviceType::kCPU);
      return;
    }
    make_resident(param, true);
    make_resident(g, false);
    make_resident(m, true);
    make_resident(v, true);
    update(i, {param.arg(), g.arg(), m.arg(), v.arg()}, param.device().type);
  }

  Offload& owner_;
};

nn::NamedTensors Offload::ChunkedAdamW::state() const {
  nn::NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!owner_.owns(i)) continue;  // only the owner has this chunk's states
    out.emplace_back(params_[i].first + ".exp_avg", owner_.view(kExpAvg, i));
    out.emplace_back(params_[i].first + ".exp_avg_sq", owner_.view(kExpAvgSq, i));
  }
  return out;
}

Offload::Offload(const nn::NamedTensors& params, const OffloadOptions& options)
    : options_(options) {
  // Unique parameters (tied weights once), in the model's order: the gradient norm and
  // checkpoints walk them in this order, so the sums match the plain loop's (the optimizer goes
  // chunk by chunk; its per-parameter updates are independent of their order).
  std::unordered_set<TensorImpl*> seen;
  int64_t largest = 0;
  MAMMOTH_CHECK(!params.empty()) << "[offload] the model has no parameters";
  device_ = params.front().second.device();
  for (const auto& [name, p] : params) {
    if (!seen.insert(p.impl()).second) continue;
    MAMMOTH_CHECK(p.device() == device_)
        << "[offload] parameter '" << name << "' is on " << p.device() << " but '"
        << params.front().first << "' is on " << device_ << ": chunks live on one device";
    MAMMOTH_CHECK(p.is_contiguous() && is_floating(p.dtype()))
        << "[offload] parameter '" << name << "' must be a contiguous floating-point tensor";
    params_.emplace_back(name, p);
    largest = std::max<int64_t>(largest, static_cast<int64_t>(p.nbytes()));
  }
  state_bytes_ = offload::model_state_bytes(params);
  MAMMOTH_CHECK(!params_.empty()) << "[offload] the model has no parameters";
  if (options.group != nullptr && options.group->size() > 1) {
    dp_ = options.group;
    rank_ = dp_->rank();
    world_ = dp_->size();
    // One all-reduce per chunk needs one element type per chunk; the zoo's models have one.
    dtype_ = params_[0].second.dtype();
    for (const auto& [name, p] : params_) {
      MAMMOTH_CHECK(p.dtype() == dtype_)
          << "[offload] data parallelism reduces whole chunks: parameter '" << name << "' is "
          << dtype_name(p.dtype()) << " but '" << params_[0].first << "' is " << dtype_name(dtype_);
    }
  }
  if (device_.is_cuda()) {
    MAMMOTH_CHECK(dp_ == nullptr)
        << "[offload] data parallelism over chunks runs on the CPU backend only so far";
    MAMMOTH_CHECK(options.auto_device_size == 0)
        << "[offload] --device-mem auto on CUDA is not implemented yet: give a size";
  }
  host_update_ = options.mode != Mode::kNone && (device_.is_cuda() || options.host_update);
  requested_chunk_bytes_ = options.chunk_bytes;
  // A chunk holds the largest parameter (kernels read a parameter as one buffer), unless the
  // budgets cannot then hold the chunks one update needs at once (the device-computed lists; the
  // NVMe-homed moments' host staging): a token table beside its gradient at 1/8 of gpt2's state.
  // Then a parameter larger than --chunk-mb spans several consecutive chunks of each list, paged
  // in together (ChunkManager::acquire_span) for the kernels that read it whole and piece by
  // piece for the update, so the device needs its pieces plus one chunk. One process on the CPU
  // backend only: under dp a chunk is the unit of ownership and reduction, and the CUDA tier's
  // spans are unproven, so there the budget is refused as before.
  const int device_lists = options.mode == Mode::kNone ? 4 : 2;
  const int64_t chunk_bytes =
      chunks::choose_chunk_bytes(
          options.chunk_bytes, largest, options.device_mem, device_lists, options.host_mem,
          options.mode == Mode::kNvme,
          dp_ == nullptr && !device_.is_cuda() && options.auto_device_size == 0)
          .chunk_bytes;

  chunks::ChunkManagerOptions mo;
  mo.chunk_bytes = chunk_bytes;
  mo.device_budget = options.device_mem;
  if (options.auto_device_size > 0) {
    MAMMOTH_CHECK(options.device_mem == 0)
        << "[offload] --device-mem is either a size or auto:SIZE, not both";
    // The first step: the smallest device cache an update needs (its device-computed lists)
    // plus the prefetch depth, whole chunks as the manager rounds them.
    const int64_t b = static_cast<int64_t>(memory::io::kBlockSize);
    const int64_t rounded = (chunk_bytes + b - 1) / b * b;
    mo.device_budget = (device_lists + options.prefetch_depth) * rounded;
    MAMMOTH_CHECK(mo.device_budget < options.auto_device_size)
        << "[offload] --device-mem auto:" << chunks::short_bytes(options.auto_device_size)
        << " is smaller than the first step's device cache of " << device_lists << " + "
        << options.prefetch_depth << " chunks of " << chunks::short_bytes(rounded) << " ("
        << chunks::short_bytes(mo.device_budget) << "), before any activations";
    auto_.device_size = options.auto_device_size;
  }
  mo.host_budget = options.host_mem;
  mo.nvme_dir = options.nvme_dir;
  mo.io = options.io;
  mo.prefetch_depth = options.prefetch_depth;
  mo.device = device_.is_cuda() ? device_ : Device::cpu();
  MAMMOTH_CHECK(options.mode != Mode::kNvme || !options.nvme_dir.empty())
      << "[train] --offload=nvme needs --nvme-dir";
  MAMMOTH_CHECK(options.params != Mode::kNvme || !options.nvme_dir.empty())
      << "[train] --offload-params=nvme needs --nvme-dir";
  // The host-update flow hands the CPU AdamW the parameters' and gradients' host homes; an NVMe
  // home has none (and a CUDA device tier loads only from pinned host memory).
  MAMMOTH_CHECK(options.params != Mode::kNvme || !host_update_)
      << "[train] --offload-params=nvme needs the AdamW states computed beside the parameters "
      << "("
      << (device_.is_cuda() ? "CUDA parameters page through host memory only"
                            : "the host-update flow reads the parameters' host homes")
      << "): use --offload-params=host, or nvme with the CPU backend's device-side update";
  manager_ = std::make_unique<chunks::ChunkManager>(mo);
  const int64_t cb = manager_->chunk_bytes();

  // Packing order: the recorded first use, else the model's order.
  std::vector<size_t> order;
  if (!options.use_order.empty()) {
    std::vector<bool> placed(params_.size(), false);
    for (const std::string& name : options.use_order) {
      for (size_t i = 0; i < params_.size(); ++i) {
        if (!placed[i] && params_[i].first == name) {
          placed[i] = true;
          order.push_back(i);
        }
      }
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!placed[i]) order.push_back(i);  // never touched (or an alias's name): at the end
    }
    use_ordered_ = true;
  } else {
    for (size_t i = 0; i < params_.size(); ++i) order.push_back(i);
  }

  // Layout: first fit in packing order.
  std::vector<int64_t> sizes;
  for (size_t i : order) sizes.push_back(static_cast<int64_t>(params_[i].second.nbytes()));
  const chunks::ChunkLayout layout = chunks::pack_chunks(sizes, cb);
  slots_.resize(params_.size());
  for (size_t j = 0; j < order.size(); ++j) {
    const chunks::ChunkPlace& at = layout.places[j];
    slots_[order[j]] = Slot{at.chunk, at.offset, at.pieces};
  }
  chunk_used_ = layout.used;
  chunk_params_ = layout.members;
  chunk_members_.resize(chunk_used_.size());
  for (size_t i = 0; i < params_.size(); ++i) chunk_members_[slots_[i].chunk].push_back(i);

  // The host-update flow homes parameters and gradients on the host: the CPU AdamW reads and
  // writes those copies, the device only caches them.
  const std::vector<Tier> device_first =
      host_update_ ? std::vector<Tier>{Tier::kHost} : std::vector<Tier>{Tier::kDevice, Tier::kHost};
  // --offload-params: the homes of the parameter and gradient chunks (the device caches them).
  const std::vector<Tier> param_homes =
      options.params == Mode::kNvme   ? std::vector<Tier>{Tier::kNvme}
      : options.params == Mode::kHost ? std::vector<Tier>{Tier::kHost}
                                      : device_first;
  const chunks::ChunkListSpec specs[kNumLists] = {
      {"params", Tier::kDevice, param_homes, "param"},
      {"grads", Tier::kDevice, param_homes, "grad"},
      options.mode == Mode::kNone
          ? chunks::ChunkListSpec{"exp_avg", Tier::kDevice, device_first, "exp_avg"}
          : chunks::ChunkListSpec{"exp_avg",
                                  Tier::kHost,
                                  {options.mode == Mode::kHost ? Tier::kHost : Tier::kNvme},
                                  "exp_avg"},
      options.mode == Mode::kNone
          ? chunks::ChunkListSpec{"exp_avg_sq", Tier::kDevice, device_first, "exp_avg_sq"}
          : chunks::ChunkListSpec{"exp_avg_sq",
                                  Tier::kHost,
                                  {options.mode == Mode::kHost ? Tier::kHost : Tier::kNvme},
                                  "exp_avg_sq"},
  };
  Device list_device[kNumLists];
  for (int l = 0; l < kNumLists; ++l) {
    list_device[l] = specs[l].compute == Tier::kDevice ? device_ : Device::cpu();
    const int list = manager_->add_list(specs[l]);
    for (size_t k = 0; k < chunk_used_.size(); ++k) {
      // AdamW states exist only for the chunks this dp rank owns.
      const bool held = l < kExpAvg || owner(static_cast<int>(k)) == rank_;
      ids_[l].push_back(held ? manager_->add_chunk(list, chunk_used_[k]) : -1);
    }
  }
  // Each chunk names its tensors in the profiler's chunk moves: the first and last of them,
  // and a span's pieces theirs, numbered.
  for (size_t k = 0; k < chunk_members_.size(); ++k) {
    const std::vector<size_t>& m = chunk_members_[k];
    if (m.empty()) continue;
    std::string label = params_[m.front()].first;
    if (m.size() > 1) label += ".." + params_[m.back()].first;
    label += " (" + std::to_string(m.size()) + ")";
    for (int l = 0; l < kNumLists; ++l) {
      if (ids_[l][k] >= 0) manager_->set_label(ids_[l][k], label);
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.pieces == 1) continue;
    for (int l = 0; l < kNumLists; ++l) {
      manager_->declare_span(ids_[l][s.chunk], s.pieces);
      for (int j = 0; j < s.pieces; ++j) {
        manager_->set_label(ids_[l][s.chunk + j], params_[i].first + " [" + std::to_string(j + 1) +
                                                      "/" + std::to_string(s.pieces) + "]");
      }
    }
  }
  manager_->finalize();

  // One Storage per chunk, shared by every tensor in it; the manager points it at wherever the
  // chunk's bytes are, and kernel launches page it in through the hook.
  // A spanning parameter's storage covers its pieces; its hook pages them in together and sets
  // the address, and any move of a piece clears it (a read that bypasses the hook fails loudly).
  chunks::ChunkManager* mgr = manager_.get();
  for (int l = 0; l < kNumLists; ++l) {
    span_storages_[l].resize(params_.size());
    std::vector<Storage*> span_of(ids_[l].size(), nullptr);
    for (size_t i = 0; i < params_.size(); ++i) {
      const Slot& s = slots_[i];
      if (s.pieces == 1) continue;
      const chunks::ChunkId first = ids_[l][s.chunk];
      const int n = s.pieces;
      auto st =
          std::make_shared<Storage>(nullptr, static_cast<size_t>(n * cb), list_device[l], [] {});
      Storage* raw = st.get();
      st->ensure_resident = [mgr, first, n, raw](bool write) {
        raw->data = mgr->acquire_span(first, n, write);
      };
      for (int j = 0; j < n; ++j) span_of[static_cast<size_t>(s.chunk + j)] = raw;
      span_storages_[l][i] = std::move(st);
    }
    for (size_t k = 0; k < ids_[l].size(); ++k) {
      const chunks::ChunkId id = ids_[l][k];
      if (id < 0) {
        storages_[l].push_back(nullptr);
        continue;
      }
      auto st = std::make_shared<Storage>(nullptr, static_cast<size_t>(cb), list_device[l], [] {});
      Storage* raw = st.get();
      Storage* span = span_of[k];
      st->ensure_resident = [mgr, id](bool write) { mgr->acquire(id, write); };
      manager_->set_observer(id, [raw, span](void* p) {
        raw->data = p;
        if (span != nullptr) span->data = nullptr;
      });
      storages_[l].push_back(std::move(st));
    }
  }

  // Move the parameter values in, chunk by chunk (each acquire may evict the previous chunk).
  for (size_t i : order) {
    const Tensor& p = params_[i].second;
    const Slot& s = slots_[i];
    char* base = static_cast<char*>(manager_->acquire_span(ids_[kParams][s.chunk], s.pieces, true));
    copy_bytes(base + s.offset, device_, p.raw_data(), p.device(), p.nbytes());
    TensorImpl* impl = p.impl();
    impl->storage = s.pieces > 1 ? span_storages_[kParams][i] : storages_[kParams][s.chunk];
    impl->offset = s.offset / static_cast<int64_t>(dtype_size(p.dtype()));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    grad_views_.push_back(view(kGrads, i));
    set_grad_ready_hook(params_[i].second, [this, i] { on_grad_ready(i); });
  }
  if (dp_) {
    // Every replica starts from rank 0's parameters.
    for (int k = 0; k < num_chunks(); ++k) {
      dp_->broadcast(flat(k, manager_->acquire(ids_[kParams][k], true)), 0);
    }
    param_ready_.assign(params_.size(), false);
    std::vector<int> order, need;
    for (int k = num_chunks() - 1; k >= 0; --k) order.push_back(k);
    need = chunk_params_;
    reducer_ = std::make_unique<OrderedReducer>(std::move(order), std::move(need), kCommBuffers,
                                                [this](int k) { return launch_average(k); });
  }
  manager_->restart_trace();  // the trace is the first training step's, not this set-up
}

Offload::~Offload() {
  // Copy the values back into ordinary storage so the model outlives this object.
  try {
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor& p = params_[i].second;
      make_resident(p, false);
      Tensor own = Tensor::empty(p.shape(), p.dtype(), p.device());
      copy_bytes(own.raw_data(), p.device(), p.raw_data(), p.device(), p.nbytes());
      TensorImpl* impl = p.impl();
      impl->storage = own.storage();
      impl->offset = 0;
      impl->grad = Tensor();
      impl->grad_ready_hook = nullptr;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[offload] restoring parameters failed: %s\n", e.what());
  }
  for (int l = 0; l < kNumLists; ++l) {
    for (auto* list : {&storages_[l], &span_storages_[l]}) {
      for (auto& st : *list) {
        if (!st) continue;  // a state chunk another dp rank owns, or a parameter in one chunk
        st->ensure_resident = nullptr;
        st->data = nullptr;  // views that outlive the manager fail loudly, never read freed bytes
      }
    }
  }
  optimizer_.reset();
}

Tensor Offload::view(List list, size_t i) const {
  const Tensor& p = params_[i].second;
  MAMMOTH_CHECK(storages_[list][slots_[i].chunk] != nullptr)
      << "[offload] the AdamW state of '" << params_[i].first << "' lives on dp rank "
      << owner(slots_[i].chunk) << ", not on rank " << rank_;
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = slots_[i].pieces > 1 ? span_storages_[list][i] : storages_[list][slots_[i].chunk];
  impl->offset = slots_[i].offset / static_cast<int64_t>(dtype_size(p.dtype()));
  impl->shape = p.shape();
  impl->strides = contiguous_strides(p.shape());
  impl->dtype = p.dtype();
  return Tensor(std::move(impl));
}

Tensor Offload::piece(List list, size_t i, int j) const {
  const Tensor& p = params_[i].second;
  const int64_t cb = manager_->chunk_bytes();
  const int64_t bytes = std::min(cb, static_cast<int64_t>(p.nbytes()) - j * cb);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storages_[list][static_cast<size_t>(slots_[i].chunk + j)];
  impl->offset = 0;
  impl->shape = {bytes / static_cast<int64_t>(dtype_size(p.dtype()))};
  impl->strides = {1};
  impl->dtype = p.dtype();
  return Tensor(std::move(impl));
}

void Offload::on_grad_ready(size_t i) {
  TensorImpl* impl = params_[i].second.impl();
  const Tensor g = impl->grad;
  const Tensor& dst = grad_views_[i];
  if (g.defined() && g.impl() != dst.impl()) {
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
  // The last micro-batch of a step: a chunk whose gradients are all final is reduced now.
  if (dp_ && sync_ && !param_ready_[i]) {
    param_ready_[i] = true;
    reducer_->ready(slots_[i].chunk);
  }
}

Tensor Offload::flat(int chunk, void* base) const {
  const int64_t n =
      chunk_used_[static_cast<size_t>(chunk)] / static_cast<int64_t>(dtype_size(dtype_));
  return Tensor::from_blob(base, {n}, dtype_, Device::cpu(), nullptr);
}

// The reducer's launch of chunk k's average (chunks are reduced in one fixed order on every
// rank, the last chunk first: the order in which backward finishes them when chunks follow the
// forward). The chunk is copied into a host buffer (it may move while the collective runs);
// completing it copies the average back into the gradient chunk on every rank, so the norm and
// fp16's skip decision are computed from the same bytes everywhere.
OrderedReducer::Op Offload::launch_average(int k) {
  Tensor buffer = take_buffer();
  const void* src = manager_->acquire(ids_[kGrads][k], false);
  std::memcpy(buffer.raw_data(), src, static_cast<size_t>(chunk_used_[k]));
  return {nullptr, receive(k, kGrads, buffer, dp_->start_average(flat(k, buffer.raw_data())))};
}

// Waits for a collective on `buffer`, copies the result into chunk k of `into` (kNone: nothing
// to copy) and recycles the buffer.
std::function<void()> Offload::receive(int k, List into, Tensor buffer,
                                       std::function<void()> wait) {
  return [this, k, into, buffer = std::move(buffer), wait = std::move(wait)]() mutable {
    wait();
    if (into != kNone) {
      void* dst = manager_->acquire(ids_[into][k], true);
      std::memcpy(dst, buffer.raw_data(), static_cast<size_t>(chunk_used_[k]));
    }
    free_buffers_.push_back(std::move(buffer));
  };
}

Tensor Offload::take_buffer() {
  if (free_buffers_.empty()) {
    return Tensor::empty({manager_->chunk_bytes() / static_cast<int64_t>(dtype_size(dtype_))},
                         dtype_);
  }
  Tensor buffer = free_buffers_.back();
  free_buffers_.pop_back();
  return buffer;
}

void Offload::begin_backward(bool sync) {
  sync_ = sync;
  if (!sync) return;
  std::fill(param_ready_.begin(), param_ready_.end(), false);
  reducer_->begin();
}

void Offload::finish_backward() {
  // Chunks with a parameter that got no gradient never became ready: reduce them now.
  reducer_->launch_rest();
  reducer_->complete_all();
  sync_ = false;
}

bool Offload::decays(const std::string& name) const {
  for (const auto& [n, p] : params_) {
    if (n == name) return optim::decay_matrices(n, p);
  }
  return false;
}

double Offload::grad_norm() {
  // Every rank holds the averaged gradients: the same sum, in the model's order, everywhere.
  return optim::grad_norm(params_);
}

// Chunk k's parameters are final on its owner: broadcast them from a host buffer (the chunk
// itself may move while the collective runs). Every rank calls this for every chunk in order,
// so the collectives match; a receiver copies the bytes into its chunk when it drains them.
void Offload::publish(int chunk) {
  // Room under the bound first: the buffer comes from a completed collective when there is one.
  reducer_->make_room();
  Tensor buffer = take_buffer();
  const int root = owner(chunk);
  if (root == rank_) {
    const void* src = manager_->acquire(ids_[kParams][chunk], false);
    std::memcpy(buffer.raw_data(), src, static_cast<size_t>(chunk_used_[chunk]));
  }
  std::function<void()> wait = dp_->start_broadcast(flat(chunk, buffer.raw_data()), root);
  reducer_->post({nullptr, receive(chunk, root == rank_ ? kNone : kParams, std::move(buffer),
                                   std::move(wait))});
}

void Offload::after_step() {
  // The broadcasts the optimizer walk started (publish): wait, and take in the others' chunks.
  reducer_->complete_all();
}

double Offload::average(double value) { return dp_ ? dp_->average(value) : value; }

void Offload::barrier() {
  if (dp_) dp_->barrier();
}

namespace {

Tensor copy_out(const Tensor& v) {
  make_resident(v, false);
  return host_copy(v);
}

}  // namespace

std::vector<train::CheckpointPiece> Offload::checkpoint_pieces(
    const nn::NamedTensors& /*state*/, const std::vector<std::string>& suffixes, bool writing) {
  NoGradGuard ng;
  for (const std::string& suffix : suffixes) {
    MAMMOTH_CHECK(suffix == "exp_avg" || suffix == "exp_avg_sq")
        << "[offload] no optimizer state '" << suffix << "'";
  }
  // Copies (chunks move, and NVMe-homed ones have no address): written from them, or loaded
  // into them and copied into the chunks by pieces_loaded(). The owner of a chunk writes its
  // parameters and states, whole; loading reads every parameter and the owned states.
  std::vector<train::CheckpointPiece> out;
  loading_.clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_[i].first;
    const Tensor& p = params_[i].second;
    if (writing && !owns(i)) continue;
    std::vector<std::pair<std::string, Tensor>> held = {
        {name, writing ? copy_out(p) : Tensor::zeros(p.shape(), p.dtype())}};
    if (owns(i)) {
      for (List l : {kExpAvg, kExpAvgSq}) {
        const std::string n = name + (l == kExpAvg ? ".exp_avg" : ".exp_avg_sq");
        held.emplace_back(n, writing ? copy_out(view(l, i)) : Tensor::zeros(p.shape(), p.dtype()));
      }
    }
    for (auto& [n, t] : held) {
      out.push_back({n, 0, t});
      if (!writing) loading_.emplace_back(n, t);
    }
  }
  return out;
}

void Offload::pieces_loaded() {
  NoGradGuard ng;
  for (const auto& [name, t] : loading_) {
    bool done = false;
    for (size_t i = 0; i < params_.size() && !done; ++i) {
      const std::string& p = params_[i].first;
      if (name == p) {
        make_resident(params_[i].second, true);
        copy_(params_[i].second, t.to(params_[i].second.device()));
        done = true;
      } else if (name == p + ".exp_avg" || name == p + ".exp_avg_sq") {
        const Tensor v = view(name == p + ".exp_avg" ? kExpAvg : kExpAvgSq, i);
        make_resident(v, true);
        copy_(v, t.to(v.device()));
        done = true;
      }
    }
    MAMMOTH_CHECK(done) << "[offload] loaded a checkpoint piece '" << name
                        << "' it has no place for";
  }
  loading_.clear();
}

std::vector<int> Offload::chunk_of_params() const {
  std::vector<int> out;
  for (const Slot& s : slots_) out.push_back(s.chunk);
  return out;
}

Offload::MemoryReport Offload::memory() const {
  MemoryReport m;
  for (int k = 0; k < num_chunks(); ++k) {
    m.params += chunk_used_[k];
    m.grads += chunk_used_[k];
    if (owner(k) == rank_) m.optimizer += 2 * chunk_used_[k];
  }
  return m;
}

optim::Optimizer& Offload::optimizer(const optim::AdamWOptions& options) {
  if (!optimizer_) optimizer_ = std::make_unique<ChunkedAdamW>(*this, options);
  return *optimizer_;
}

void Offload::end_step() {
  // The step's gradients are consumed (or the step was skipped): never write them back.
  for (chunks::ChunkId id : ids_[kGrads]) manager_->discard(id);
  manager_->end_step();
  if (auto_.device_size > 0 && auto_.chunk_budget == 0) {
    // The loop resets the allocator's peak at the start of each step: this is the first step's
    // high-water mark of everything that is not chunk memory (chunks are not allocated there).
    auto_.traced_peak = memory::cpu_allocator().stats().peak_bytes;
    auto_.margin = auto_.traced_peak / kAutoMarginDivisor;
    const int64_t left = auto_.device_size - auto_.traced_peak - auto_.margin;
    const int64_t first = manager_->device_budget();
    MAMMOTH_CHECK(left >= first)
        << "[offload] --device-mem auto:" << chunks::short_bytes(auto_.device_size)
        << ": the first step's traced peak of non-chunk memory (activations, temporaries) is "
        << chunks::short_bytes(auto_.traced_peak) << "; with a margin of "
        << chunks::short_bytes(auto_.margin) << " (1/" << kAutoMarginDivisor
        << " of it) that leaves " << chunks::short_bytes(left) << " for chunks, less than the "
        << chunks::short_bytes(first) << " the first step's device cache used: raise the size or "
        << "lower --chunk-mb or --micro-batch";
    auto_.chunk_budget = manager_->set_device_budget(left);
  }
}

nn::NamedTensors Offload::gather_state() {
  MAMMOTH_CHECK(!dp_) << "[offload] under dp the AdamW state is sharded: use checkpoint_pieces";
  NoGradGuard ng;
  nn::NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (List l : {kExpAvg, kExpAvgSq}) {
      const Tensor v = view(l, i);
      make_resident(v, false);
      const Tensor copy = host_copy(v);
      out.emplace_back(params_[i].first + (l == kExpAvg ? ".exp_avg" : ".exp_avg_sq"), copy);
    }
  }
  return out;
}

void Offload::scatter_state(const nn::NamedTensors& full) {
  MAMMOTH_CHECK(!dp_) << "[offload] under dp the AdamW state is sharded: use checkpoint_pieces";
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
      copy_(v, src->to(v.device()));
    }
  }
}

json::Value tier_stats_json(const memory::chunks::ChunkManager& manager) {
  json::Value out = json::Value::object();
  for (int t = 0; t < chunks::kNumTiers; ++t) {
    const chunks::TierStats& s = manager.stats(static_cast<Tier>(t));
    json::Value v = json::Value::object();
    v.set("budget", json::Value(s.budget));
    v.set("home_bytes", json::Value(s.home_bytes));
    v.set("peak_bytes", json::Value(s.peak_bytes));
    v.set("reserved_bytes", json::Value(s.reserved_bytes));
    v.set("moves_in", json::Value(s.moves_in));
    v.set("bytes_in", json::Value(s.bytes_in));
    v.set("moves_out", json::Value(s.moves_out));
    v.set("bytes_out", json::Value(s.bytes_out));
    v.set("stall_s", json::Value(s.stall_s));
    out.set(chunks::tier_name(static_cast<Tier>(t)), v);
  }
  return out;
}

json::Value Offload::metrics() const {
  json::Value out = tier_stats_json(*manager_);
  const MemoryReport m = memory();
  out.set("optimizer_state_bytes", json::Value(m.optimizer));
  if (auto_.device_size > 0) {
    json::Value a = json::Value::object();
    a.set("device_size", json::Value(auto_.device_size));
    a.set("traced_peak", json::Value(auto_.traced_peak));
    a.set("margin", json::Value(auto_.margin));
    a.set("chunk_budget", json::Value(auto_.chunk_budget));
    out.set("auto", a);
  }
  out.set("chunks", json::Value(static_cast<int64_t>(num_chunks())));
  return out;
}

std::string Offload::report() const {
  std::string out = "[offload] --offload=" + std::string(mode_name(options_.mode)) + ": " +
                    std::to_string(params_.size()) +
                    " parameters, parameters + gradients + AdamW " + "states " +
                    chunks::short_bytes(state_bytes_);
  if (manager_->chunk_bytes() > requested_chunk_bytes_)
    out += "; chunks raised from " + chunks::short_bytes(requested_chunk_bytes_) +
           " to the largest parameter";
  int spanning = 0, longest = 0;
  for (const Slot& s : slots_) {
    if (s.pieces > 1) ++spanning;
    longest = std::max(longest, s.pieces);
  }
  if (spanning > 0) {
    out += "; " + std::to_string(spanning) + " parameter(s) larger than a chunk span up to " +
           std::to_string(longest) + " chunks each";
  }
  out += use_ordered_ ? "; packed in first-use order" : "; packed in the model's order";
  if (device_.is_cuda()) out += "; device tier " + device_.str();
  if (options_.params != Mode::kNone)
    out += std::string("; parameters and gradients homed on ") + mode_name(options_.params);
  if (host_update_) {
    out += "; parameters and gradients homed on the host, updated there by the CPU AdamW";
  }
  out += "\n";
  if (auto_.device_size > 0) {
    out += "[offload] --device-mem auto:" + chunks::short_bytes(auto_.device_size) + ": ";
    if (auto_.chunk_budget == 0) {
      out += "the first step runs with a device cache of " +
             chunks::short_bytes(manager_->device_budget()) +
             "; its traced peak of non-chunk memory sets the budget for step 2 on\n";
    } else {
      out += "traced peak of non-chunk memory (first step) " +
             chunks::short_bytes(auto_.traced_peak) + " + margin " +
             chunks::short_bytes(auto_.margin) + " (1/" + std::to_string(kAutoMarginDivisor) +
             "): chunks get " + chunks::short_bytes(auto_.chunk_budget) + "\n";
    }
  }
  if (dp_) {
    const MemoryReport m = memory();
    int owned = 0;
    for (int k = 0; k < num_chunks(); ++k) owned += owner(k) == rank_;
    out += "[offload] dp rank " + std::to_string(rank_) + " of " + std::to_string(world_) +
           ": owns " + std::to_string(owned) + " of " + std::to_string(num_chunks()) +
           " chunks (chunk k: rank k % " + std::to_string(world_) + "), AdamW states " +
           chunks::short_bytes(m.optimizer) + " of the model's " +
           chunks::short_bytes(state_bytes_ / 2) + "; gradient chunks averaged over dp\n";
  }
  return out + manager_->report();
}

}  // namespace mammoth::engine::offload
