#include "parallel/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "base/fault.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "memory/allocator.h"

namespace mammoth::parallel {

using engine::Tensor;

DataParallel::DataParallel(const engine::nn::NamedTensors& params, Communicator& dp,
                           const DataParallelOptions& options)
    : params_(params), dp_(dp), options_(options) {
  MAMMOTH_CHECK(options.zero_stage >= 0 && options.zero_stage <= 3)
      << "[data_parallel] --zero must be 0, 1, 2 or 3, got " << options.zero_stage;
  MAMMOTH_CHECK(options.bucket_mb > 0)
      << "[data_parallel] --bucket-mb must be > 0, got " << options.bucket_mb;
  MAMMOTH_CHECK(options.resident_buckets >= 1)
      << "[data_parallel] resident_buckets must be >= 1, got " << options.resident_buckets;
  const int n = dp.size();
  DType dtype = params_.empty() ? DType::kF32 : params_[0].second.dtype();
  int64_t bucket_bytes = static_cast<int64_t>(options.bucket_mb * 1024 * 1024);
  if (options.zero_stage >= 2) {
    // What stays full-size (buckets in flight, gathered) must be small next to the shards.
    int64_t total = 0;
    for (const auto& [name, p] : params_) total += p.numel();
    bucket_bytes = std::min(bucket_bytes,
                            total * static_cast<int64_t>(dtype_size(dtype)) / kMinShardedBuckets);
  }
  bucket_of_.assign(params_.size(), -1);
  // Reverse registration order: the last layers' gradients are ready first.
  Bucket current;
  int64_t current_elems = 0;
  if (!params_.empty()) device_ = params_[0].second.device();
  auto close = [&] {
    if (current.params.empty()) return;
    current.padded = (current_elems + n - 1) / n * n;
    buckets_.push_back(std::move(current));
    current = Bucket();
    current_elems = 0;
  };
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    const Tensor& p = params_[i].second;
    MAMMOTH_CHECK(p.dtype() == dtype && p.is_contiguous() && p.device() == device_)
        << "[data_parallel] parameter '" << params_[i].first
        << "' must be a contiguous tensor of the same dtype and device as the others ("
        << dtype_name(dtype) << " on " << device_ << ")";
    current.params.push_back(i);
    current.offsets.push_back(current_elems);
    current_elems += p.numel();
    if (current_elems * static_cast<int64_t>(dtype_size(dtype)) >=
        std::max<int64_t>(bucket_bytes, 1))
      close();
  }
  close();
  // Move each bucket's parameters into its flat buffer; the model's tensors become views.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bk = buckets_[b];
    bk.flat_params = Tensor::zeros({bk.padded}, dtype, device_);
    if (options.zero_stage >= 2) {
      bk.shard_grads = Tensor::zeros({bk.padded / n}, dtype, device_);
    } else {
      bk.flat_grads = Tensor::zeros({bk.padded}, dtype, device_);
    }
    for (size_t k = 0; k < bk.params.size(); ++k) {
      const int i = bk.params[k];
      bucket_of_[i] = static_cast<int>(b);
      const Tensor& p = params_[i].second;
      engine::copy_(bk.flat_params.slice(0, bk.offsets[k], bk.offsets[k] + p.numel()),
                    p.reshape({-1}));
      engine::TensorImpl* impl = p.impl();
      impl->storage = bk.flat_params.storage();
      impl->offset = bk.offsets[k];
      impl->strides = engine::contiguous_strides(impl->shape);
      engine::set_grad_ready_hook(p, [this, i, b] {
        if (!sync_) return;
        record(DpTraceEvent::kGradReady, i);
        on_grad_ready(static_cast<int>(b));
      });
    }
  }
  // Buckets launch in index order (the order backward finishes them), each once all its
  // parameters' gradients are final; stages 2, 3 bound the full-size buffers alive at once.
  std::vector<int> order, need;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    order.push_back(static_cast<int>(b));
    need.push_back(static_cast<int>(buckets_[b].params.size()));
  }
  reducer_ = std::make_unique<engine::offload::OrderedReducer>(
      std::move(order), std::move(need), options.zero_stage >= 2 ? kMaxInFlight : 0,
      [this](int b) { return launch(b); });
  if (options.zero_stage == 3) {
    int64_t largest_shard = 0;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      Bucket& bk = buckets_[b];
      bk.shard_params = shard_of(bk.flat_params).clone();
      bk.flat_params.storage()->ensure_resident = [this, b](bool) { make_resident(b); };
      largest_shard = std::max<int64_t>(largest_shard, bk.shard_params.nbytes());
    }
    MAMMOTH_CHECK(options.shard_nvme_dir.empty() || device_.is_cpu())
        << "[data_parallel] ZeRO-3 shards on NVMe run on the CPU backend only so far";
    if (!options.shard_nvme_dir.empty()) page_shards(largest_shard);
  } else {
    MAMMOTH_CHECK(options.shard_nvme_dir.empty())
        << "[data_parallel] parameter shards on NVMe need ZeRO stage 3, not " << options.zero_stage;
  }
  // What this rank's optimizer updates.
  if (options.zero_stage == 0) {
    opt_params_ = params_;
    for (size_t i = 0; i < params_.size(); ++i) {
      opt_decay_.push_back(params_[i].second.dim() >= 2);
      opt_source_.push_back(static_cast<int>(i));
      opt_offset_.push_back(0);
    }
    return;
  }
  const int r = dp.rank();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bk = buckets_[b];
    const int64_t shard = bk.padded / n, lo = r * shard, hi = lo + shard;
    for (size_t k = 0; k < bk.params.size(); ++k) {
      const auto& [name, p] = params_[bk.params[k]];
      const int64_t a = std::max(lo, bk.offsets[k]), e = std::min(hi, bk.offsets[k] + p.numel());
      if (a >= e) continue;
      // Stage 3: the shard buffer is the parameters' home; the full bucket is a cache.
      Tensor seg = options.zero_stage == 3 ? bk.shard_params.slice(0, a - lo, e - lo)
                                           : bk.flat_params.slice(0, a, e);
      opt_params_.emplace_back(name + "[" + std::to_string(a - bk.offsets[k]) + ":" +
                                   std::to_string(e - bk.offsets[k]) + "]",
                               seg);
      opt_decay_.push_back(p.dim() >= 2);
      opt_source_.push_back(bk.params[k]);
      opt_offset_.push_back(a - bk.offsets[k]);
      opt_where_.emplace_back(static_cast<int>(b), a);
    }
  }
}

// Moves every bucket's shard into a chunk homed on NVMe: the shard tensor keeps its shape, its
// storage follows the chunk (the observer re-points it as the chunk moves) and every kernel
// launch on it pages it in through the residency hook; raw readers (the all-gather, checkpoint
// writes) page it in first.
void DataParallel::page_shards(int64_t chunk_bytes) {
  namespace chunks = memory::chunks;
  chunks::ChunkManagerOptions mo;
  mo.chunk_bytes = chunk_bytes;
  mo.device_budget = options_.shard_device_mem;
  mo.host_budget = options_.shard_host_mem;
  mo.nvme_dir = options_.shard_nvme_dir;
  shard_chunks_ = std::make_unique<chunks::ChunkManager>(mo);
  chunks::ChunkManager* mgr = shard_chunks_.get();
  const int list = mgr->add_list({"zero3_param_shards",
                                  chunks::Tier::kDevice,
                                  {chunks::Tier::kNvme},
                                  "ZeRO-3 parameter shard"});
  std::vector<chunks::ChunkId> ids;
  for (const Bucket& bk : buckets_) {
    ids.push_back(mgr->add_chunk(list, static_cast<int64_t>(bk.shard_params.nbytes())));
    // The profiler's chunk moves name the bucket's parameters (first .. last).
    if (!bk.params.empty()) {
      std::string label = params_[static_cast<size_t>(bk.params.front())].first;
      if (bk.params.size() > 1)
        label += ".." + params_[static_cast<size_t>(bk.params.back())].first;
      mgr->set_label(ids.back(), label + " (" + std::to_string(bk.params.size()) + ")");
    }
  }
  mgr->finalize();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bk = buckets_[b];
    const chunks::ChunkId id = ids[b];
    auto st = std::make_shared<engine::Storage>(nullptr, static_cast<size_t>(mgr->chunk_bytes()),
                                                device_, [] {});
    engine::Storage* raw = st.get();
    st->ensure_resident = [mgr, id](bool write) { mgr->acquire(id, write); };
    mgr->set_observer(id, [raw](void* at) { raw->data = at; });
    const Tensor values = bk.shard_params;
    engine::TensorImpl* impl = bk.shard_params.impl();
    // A fresh tensor over the chunk (the clone's impl may be shared by nothing else).
    auto fresh = std::make_shared<engine::TensorImpl>();
    fresh->storage = std::move(st);
    fresh->offset = 0;
    fresh->shape = impl->shape;
    fresh->strides = engine::contiguous_strides(impl->shape);
    fresh->dtype = impl->dtype;
    bk.shard_params = Tensor(std::move(fresh));
    engine::copy_(bk.shard_params, values);
  }
  mgr->restart_trace();  // the trace is the first step's, not this set-up
}

DataParallel::~DataParallel() {
  for (Bucket& b : buckets_) {
    if (b.work) b.work->wait();
  }
  for (const auto& [name, p] : params_) engine::set_grad_ready_hook(p, nullptr);
}

bool DataParallel::decays(const std::string& name) const {
  for (size_t i = 0; i < opt_params_.size(); ++i) {
    if (opt_params_[i].first == name) return opt_decay_[i];
  }
  MAMMOTH_THROW() << "[data_parallel] unknown optimizer parameter '" << name << "'";
}

void DataParallel::broadcast_parameters() {
  pin_all();
  for (Bucket& b : buckets_) dp_.broadcast(b.flat_params, 0);
  unpin_all(/*refresh_shards=*/true);
}

// ---- ZeRO-3: full buckets gathered on use, at most options_.resident_buckets kept ----

void DataParallel::make_resident(size_t b) {
  Bucket& bk = buckets_[b];
  bk.last_use = ++use_clock_;
  if (bk.resident) return;
  engine::Storage& st = *bk.flat_params.storage();
  st.data = st.allocator->allocate(st.nbytes);
  // MPI reads the shard's bytes directly: a paged shard comes in first.
  if (const auto& page_in = bk.shard_params.storage()->ensure_resident) page_in(false);
  dp_.all_gather(bk.shard_params, bk.flat_params);
  bk.resident = true;
  if (pinned_) return;
  // Evict the least recently used other buckets beyond the budget. Every rank runs the same
  // kernels in the same order, so every rank gathers and evicts the same buckets.
  for (;;) {
    int resident = 0;
    size_t victim = buckets_.size();
    for (size_t i = 0; i < buckets_.size(); ++i) {
      if (!buckets_[i].resident) continue;
      ++resident;
      if (i != b && (victim == buckets_.size() || buckets_[i].last_use < buckets_[victim].last_use))
        victim = i;
    }
    if (resident <= options_.resident_buckets || victim == buckets_.size()) break;
    release(victim);
  }
}

void DataParallel::release(size_t b) {
  Bucket& bk = buckets_[b];
  if (!bk.resident) return;
  engine::Storage& st = *bk.flat_params.storage();
  st.allocator->deallocate(st.data, st.nbytes);
  st.data = nullptr;
  bk.resident = false;
}

void DataParallel::pin_all() {
  if (options_.zero_stage != 3) return;
  pinned_ = true;
  for (size_t b = 0; b < buckets_.size(); ++b) make_resident(b);
}

void DataParallel::unpin_all(bool refresh_shards) {
  if (options_.zero_stage != 3) return;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (refresh_shards) engine::copy_(buckets_[b].shard_params, shard_of(buckets_[b].flat_params));
    release(b);
  }
  pinned_ = false;
}

std::vector<engine::train::CheckpointPiece> DataParallel::checkpoint_pieces(
    const engine::nn::NamedTensors& state, const std::vector<std::string>& suffixes, bool writing) {
  std::vector<engine::train::CheckpointPiece> out;
  const bool all = !writing || dp_.rank() == 0;
  if (options_.zero_stage == 3) {
    // The shard segments are the parameters' home. Paged ones are read and written raw by the
    // checkpoint code, which pages nothing in: writes take copies (a kernel pages the shard in),
    // loads land in host staging that pieces_loaded() copies in.
    staged_.clear();
    for (size_t i = 0; i < opt_params_.size(); ++i) {
      Tensor seg = opt_params_[i].second;
      if (shard_chunks_) {
        if (writing) {
          seg = seg.clone();
        } else {
          Tensor host = Tensor::empty(seg.shape(), seg.dtype(), device_);
          staged_.emplace_back(seg, host);
          seg = host;
        }
      }
      out.push_back({params_[opt_source_[i]].first, opt_offset_[i], seg});
    }
  } else if (all) {
    for (const auto& [name, p] : params_) out.push_back({name, 0, p});
  }
  if (options_.zero_stage >= 1 || all) {
    std::map<std::string, Tensor> by_name(state.begin(), state.end());
    for (size_t i = 0; i < opt_params_.size(); ++i) {
      const std::string& param = params_[opt_source_[i]].first;
      for (const std::string& suffix : suffixes) {
        auto it = by_name.find(opt_params_[i].first + "." + suffix);
        MAMMOTH_CHECK(it != by_name.end()) << "[data_parallel] the optimizer state has no '"
                                           << opt_params_[i].first << "." << suffix << "'";
        out.push_back({param + "." + suffix, opt_offset_[i], it->second});
      }
    }
  }
  return out;
}

void DataParallel::pieces_loaded() {
  // Stage 3 loaded its shards; gathered buckets hold the old values.
  for (const auto& [seg, host] : staged_) engine::copy_(seg, host);
  staged_.clear();
  if (options_.zero_stage == 3) {
    for (size_t b = 0; b < buckets_.size(); ++b) release(b);
  }
}
void DataParallel::begin_backward(bool sync) {
  sync_ = sync;
  if (!sync) return;
  trace_.clear();
  for (Bucket& b : buckets_) b.work.reset();
  reducer_->begin();
}

Tensor DataParallel::shard_of(const Tensor& flat) const {
  const int64_t shard = flat.numel() / dp_.size();
  return flat.slice(0, dp_.rank() * shard, (dp_.rank() + 1) * shard);
}

// The reducer's launch: the bucket's gradients into its flat buffer, its collective posted.
// Under stages 2, 3 the reducer has made room first (at most kMaxInFlight full-size buffers).
engine::offload::OrderedReducer::Op DataParallel::launch(int index) {
  fault::point("backward");
  Bucket& b = buckets_[static_cast<size_t>(index)];
  const bool stage2 = options_.zero_stage >= 2;
  if (stage2) b.flat_grads = Tensor::empty({b.padded}, b.shard_grads.dtype(), device_);
  const int64_t used = b.offsets.back() + params_[b.params.back()].second.numel();
  engine::fill_(b.flat_grads.slice(0, used, b.padded), 0.0);  // the padding
  // Gradients into the flat buffer; a parameter without a gradient contributes zeros. The
  // parameter's own gradient is spent then (stage 0 gets views of the reduced buffer back).
  for (size_t k = 0; k < b.params.size(); ++k) {
    const auto& [name, p] = params_[b.params[k]];
    if (grad_sync_ && p.grad().defined()) grad_sync_(name, p);
    Tensor dst = b.flat_grads.slice(0, b.offsets[k], b.offsets[k] + p.numel());
    const Tensor g = p.grad();
    if (g.defined()) {
      engine::copy_(dst, g.reshape({-1}));
    } else {
      engine::fill_(dst, 0.0);
    }
    p.zero_grad();
  }
  b.work = stage2 ? dp_.ireduce_scatter(b.flat_grads, b.shard_grads, ReduceOp::kAvg)
                  : dp_.iall_reduce(b.flat_grads, b.flat_grads, ReduceOp::kAvg);
  record(DpTraceEvent::kPost, index);
  Work* work = b.work.get();
  return {[work] { return work->test(); },
          [this, index, work, stage2] {
            work->wait();
            // Stages 2, 3: the full-size buffer is spent once the shard holds the result.
            if (stage2) buckets_[static_cast<size_t>(index)].flat_grads = Tensor();
            record(DpTraceEvent::kComplete, index);
          }};
}

void DataParallel::on_grad_ready(int bucket) {
  reducer_->ready(bucket);
  // Give MPI a chance to progress the reductions in flight; under stages 2, 3 free the
  // buffers of those that are done (in order).
  reducer_->poll(/*complete_done=*/options_.zero_stage >= 2);
}

void DataParallel::finish_backward() {
  MAMMOTH_CHECK(sync_) << "[data_parallel] finish_backward() without begin_backward(true)";
  // Parameters that got no gradient never fire their hook: launch what remains, in order.
  reducer_->launch_rest();
  reducer_->complete_all();
  if (options_.zero_stage == 0) {
    for (Bucket& b : buckets_) {
      for (size_t k = 0; k < b.params.size(); ++k) {
        const Tensor& p = params_[b.params[k]].second;
        p.set_grad(b.flat_grads.slice(0, b.offsets[k], b.offsets[k] + p.numel()).view(p.shape()));
      }
    }
  }
  if (options_.zero_stage >= 1) {
    for (size_t i = 0; i < opt_params_.size(); ++i) {
      const auto& [b, a] = opt_where_[i];
      const Tensor& seg = opt_params_[i].second;
      const Bucket& bk = buckets_[b];
      if (options_.zero_stage >= 2) {
        const int64_t lo = dp_.rank() * (bk.padded / dp_.size());
        seg.set_grad(bk.shard_grads.slice(0, a - lo, a - lo + seg.numel()));
      } else {
        seg.set_grad(bk.flat_grads.slice(0, a, a + seg.numel()));
      }
    }
  }
  sync_ = false;
}

double DataParallel::grad_norm() { return std::sqrt(grad_sq_sum()); }

double DataParallel::grad_sq_sum(const std::function<bool(const std::string&)>& include) {
  engine::nn::NamedTensors counted;
  for (size_t i = 0; i < opt_params_.size(); ++i) {
    if (!include || include(params_[opt_source_[i]].first)) counted.push_back(opt_params_[i]);
  }
  const double local = engine::optim::grad_sq_sum(counted);
  if (options_.zero_stage == 0) return local;
  Tensor s = Tensor::from_vector({local}, {1}, DType::kF64).to(device_);
  dp_.all_reduce(s, ReduceOp::kSum);
  return s.item();
}

double DataParallel::average(double value) {
  Tensor t = Tensor::from_vector({value}, {1}, DType::kF64).to(device_);
  dp_.all_reduce(t, ReduceOp::kAvg);
  return t.item();
}

void DataParallel::after_step() {
  if (options_.zero_stage == 0) return;
  if (options_.zero_stage == 3) {
    // The optimizer wrote the shards; the cached full buckets are stale.
    for (size_t b = 0; b < buckets_.size(); ++b) release(b);
    // A step's shard accesses repeat: from the first on they drive prefetch and eviction.
    if (shard_chunks_) shard_chunks_->end_step();
    return;
  }
  for (Bucket& b : buckets_) dp_.all_gather(shard_of(b.flat_params), b.flat_params);
}

int64_t DataParallel::largest_bucket_bytes() const {
  int64_t largest = 0;
  for (const Bucket& b : buckets_) largest = std::max(largest, b.padded);
  return largest *
         (params_.empty() ? 4 : static_cast<int64_t>(dtype_size(params_[0].second.dtype())));
}

DataParallel::MemoryReport DataParallel::memory(int states) const {
  MemoryReport m;
  const int64_t elem =
      params_.empty() ? 4 : static_cast<int64_t>(dtype_size(params_[0].second.dtype()));
  int64_t full = 0, shard = 0;
  for (const Bucket& b : buckets_) {
    full += b.padded;
    shard += b.padded / dp_.size();
  }
  int64_t largest = 0;
  for (const Bucket& b : buckets_) largest = std::max(largest, b.padded);
  m.params = (options_.zero_stage == 3
                  ? shard + std::min<int64_t>(options_.resident_buckets, num_buckets()) * largest
                  : full) *
             elem;
  m.grads = (options_.zero_stage >= 2 ? shard : full) * elem;
  m.optimizer = (options_.zero_stage >= 1 ? shard : full) * elem * states;
  return m;
}

}  // namespace mammoth::parallel
