#include "models/model.h"

#include <algorithm>

#include "engine/autograd.h"
#include "engine/nn/checkpoint.h"
#include "engine/ops.h"
#include "models/layers.h"

namespace mammoth::models {

engine::Tensor run_block(bool recompute,
                         const std::function<engine::Tensor(const engine::Tensor&)>& block,
                         const engine::Tensor& x) {
  if (!recompute || !engine::grad_enabled()) return block(x);
  return engine::nn::checkpoint(
      [block](const std::vector<engine::Tensor>& in) {
        return std::vector<engine::Tensor>{block(in[0])};
      },
      {x})[0];
}

using engine::Tensor;

HfLayout Model::hf_layout() const {
  HfLayout layout;
  for (const auto& [name, t] : named_parameters()) layout.params.push_back({name, name});
  return layout;
}

std::pair<Tensor, Tensor> KVCache::append(int64_t layer, const Tensor& k_new, const Tensor& v_new) {
  MAMMOTH_CHECK(layer >= 0 && layer < static_cast<int64_t>(k.size()))
      << "[KVCache::append] layer " << layer << " out of range, cache has " << k.size();
  const int64_t t = k_new.size(2);
  MAMMOTH_CHECK(length + t <= capacity) << "[KVCache::append] " << length << " cached + " << t
                                        << " new positions exceed capacity " << capacity;
  {
    engine::NoGradGuard ng;
    engine::copy_(k[layer].slice(2, length, length + t), k_new);
    engine::copy_(v[layer].slice(2, length, length + t), v_new);
  }
  return {k[layer].slice(2, 0, length + t), v[layer].slice(2, 0, length + t)};
}

Tensor LanguageModel::loss(const Tensor& ids, const Tensor& targets) {
  Tensor logits = forward(ids);
  if (targets.defined()) {
    MAMMOTH_CHECK(targets.shape() == ids.shape())
        << "[LanguageModel::loss] targets " << engine::shape_str(targets.shape())
        << " must match ids " << engine::shape_str(ids.shape());
    return engine::cross_entropy(logits, targets);
  }
  const int64_t T = ids.size(1);
  MAMMOTH_CHECK(T >= 2) << "[LanguageModel::loss] next-token loss needs sequences of at least 2 "
                           "tokens, got T="
                        << T;
  return engine::cross_entropy(logits.slice(1, 0, T - 1), ids.slice(1, 1, T));
}

Tensor LanguageModel::forward_cached(const Tensor&, KVCache*) {
  MAMMOTH_THROW() << "[forward_cached] model family " << family_name(config().family)
                  << " does not decode incrementally";
}

namespace {
[[noreturn]] void no_pipeline(const Model& m) {
  MAMMOTH_THROW() << "[pipeline] model family " << family_name(m.config().family)
                  << " has no pipeline stages yet (GPT-2 has; see Model::pipeline_*)";
}
}  // namespace

Tensor Model::pipeline_embed(const Tensor&) { no_pipeline(*this); }
Tensor Model::pipeline_block(int64_t, const Tensor&, const Tensor&) { no_pipeline(*this); }
Tensor Model::pipeline_loss(const Tensor&, const Tensor&) { no_pipeline(*this); }
Model::PipelinePart Model::pipeline_part(const std::string&) const { no_pipeline(*this); }
Tensor Model::pipeline_batch(const Tensor&, const Tensor&) const { no_pipeline(*this); }

namespace {
// Keys and values are activations: f32 when the weights are stored in 16 bits (the ops widen
// those, engine/ops/common.h), the weights' dtype otherwise.
DType cache_dtype(const ModelConfig& c) {
  return c.dtype == DType::kBF16 || c.dtype == DType::kF16 ? DType::kF32 : c.dtype;
}
}  // namespace

KVCache LanguageModel::make_cache(int64_t batch, int64_t capacity) const {
  const ModelConfig& c = config();
  MAMMOTH_CHECK(batch > 0 && capacity > 0)
      << "[make_cache] batch and capacity must be positive, got " << batch << ", " << capacity;
  KVCache cache;
  cache.capacity = capacity;
  const Device device = module_device(*this);  // the cache lives beside the weights
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const engine::Shape shape = {batch, kv_cache_heads(), capacity, c.head_dim()};
    cache.k.push_back(Tensor::zeros(shape, cache_dtype(c), device));
    cache.v.push_back(Tensor::zeros(shape, cache_dtype(c), device));
  }
  return cache;
}

}  // namespace mammoth::models

namespace mammoth::models {

PagedKVCache LanguageModel::make_paged_cache(int64_t num_blocks, int64_t block_size) const {
  const ModelConfig& c = config();
  MAMMOTH_CHECK(num_blocks > 0 && block_size > 0)
      << "[make_paged_cache] blocks and block size must be positive, got " << num_blocks << ", "
      << block_size;
  PagedKVCache cache;
  cache.block_size = block_size;
  cache.num_blocks = num_blocks;
  const Device device = module_device(*this);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const engine::Shape shape = {kv_cache_heads(), num_blocks * block_size, c.head_dim()};
    cache.k.push_back(Tensor::zeros(shape, cache_dtype(c), device));
    cache.v.push_back(Tensor::zeros(shape, cache_dtype(c), device));
  }
  return cache;
}

Tensor LanguageModel::forward_paged(const Tensor&, const std::vector<PagedSequence>&,
                                    PagedKVCache*) {
  MAMMOTH_THROW() << "[forward_paged] model family " << family_name(config().family)
                  << " has no paged KV cache (GPT-2 and LLaMA have)";
}

namespace {
// The pool row of position p of a sequence.
int64_t paged_row(const PagedKVCache& cache, const PagedSequence& seq, int64_t p) {
  return (*seq.blocks)[static_cast<size_t>(p / cache.block_size)] * cache.block_size +
         p % cache.block_size;
}
}  // namespace

std::pair<Tensor, Tensor> paged_append(PagedKVCache* cache, int64_t layer, const PagedSequence& seq,
                                       const Tensor& k_new, const Tensor& v_new) {
  const int64_t end = seq.start + seq.count;
  const Tensor k_rows = k_new.select(0, 0);  // [Hk, count, D]
  const Tensor v_rows = v_new.select(0, 0);
  const Tensor& k_pool = cache->k[static_cast<size_t>(layer)];
  const Tensor& v_pool = cache->v[static_cast<size_t>(layer)];
  {
    engine::NoGradGuard ng;
    // One copy per run of positions inside one block: rows there are consecutive.
    for (int64_t p = seq.start; p < end;) {
      const int64_t run = std::min(end - p, cache->block_size - p % cache->block_size);
      const int64_t row = paged_row(*cache, seq, p), i = p - seq.start;
      engine::copy_(k_pool.slice(1, row, row + run), k_rows.slice(1, i, i + run));
      engine::copy_(v_pool.slice(1, row, row + run), v_rows.slice(1, i, i + run));
      p += run;
    }
  }
  std::vector<int64_t> rows(static_cast<size_t>(end));
  for (int64_t p = 0; p < end; ++p) rows[static_cast<size_t>(p)] = paged_row(*cache, seq, p);
  const Tensor index = Tensor::from_ints(rows, {end}).to(k_pool.device());
  auto gather = [&](const Tensor& pool) {  // -> [1, Hk, end, D], contiguous
    return engine::index_select(pool, 1, index).unsqueeze(0);
  };
  return {gather(k_pool), gather(v_pool)};
}

Tensor paged_attention(PagedKVCache* cache, int64_t layer, const std::vector<PagedSequence>& seqs,
                       const Tensor& q, const Tensor& k, const Tensor& v, int64_t window) {
  std::vector<Tensor> ys;
  int64_t at = 0;
  for (const PagedSequence& s : seqs) {
    auto rows = [&](const Tensor& t) {  // this sequence's rows -> [1, heads, count, D]
      return t.slice(1, at, at + s.count).permute({0, 2, 1, 3});
    };
    auto [ks, vs] = paged_append(cache, layer, s, rows(k), rows(v));
    ys.push_back(
        merge_heads(attend(rows(q), ks, vs, {.causal = true, .window = window}, 0.0, false)));
    at += s.count;
  }
  return engine::concat(ys, 1);
}

Tensor paged_positions(const Tensor& ids, const std::vector<PagedSequence>& seqs,
                       const PagedKVCache& cache, int64_t max_seq, const char* who) {
  MAMMOTH_CHECK(ids.dim() == 1 && ids.dtype() == DType::kI64)
      << "[" << who << "] ids must be i64 [N], got " << dtype_name(ids.dtype()) << " "
      << engine::shape_str(ids.shape());
  MAMMOTH_CHECK(!seqs.empty()) << "[" << who << "] no sequences";
  std::vector<int64_t> pos;
  for (const PagedSequence& s : seqs) {
    MAMMOTH_CHECK(s.blocks != nullptr && s.count > 0 && s.start >= 0)
        << "[" << who << "] a sequence needs a block table and at least one new token";
    const int64_t end = s.start + s.count;
    MAMMOTH_CHECK(end <= max_seq) << "[" << who << "] positions up to " << end << " exceed max_seq "
                                  << max_seq;
    MAMMOTH_CHECK(static_cast<int64_t>(s.blocks->size()) * cache.block_size >= end)
        << "[" << who << "] " << s.blocks->size() << " blocks of " << cache.block_size
        << " cannot hold " << end << " positions";
    for (int64_t b : *s.blocks) {
      MAMMOTH_CHECK(b >= 0 && b < cache.num_blocks)
          << "[" << who << "] block " << b << " outside the pool of " << cache.num_blocks;
    }
    for (int64_t p = s.start; p < end; ++p) pos.push_back(p);
  }
  const int64_t n = static_cast<int64_t>(pos.size());
  MAMMOTH_CHECK(ids.size(0) == n) << "[" << who << "] " << ids.size(0) << " ids for sequences with "
                                  << n << " new tokens";
  return Tensor::from_ints(pos, {n}).to(ids.device());
}

Tensor paged_last_rows(const Tensor& x, const std::vector<PagedSequence>& seqs) {
  std::vector<int64_t> rows;
  int64_t at = 0;
  for (const PagedSequence& s : seqs) rows.push_back((at += s.count) - 1);
  const int64_t S = static_cast<int64_t>(rows.size());
  return engine::index_select(x, 1, Tensor::from_ints(rows, {S}).to(x.device()));
}

}  // namespace mammoth::models
