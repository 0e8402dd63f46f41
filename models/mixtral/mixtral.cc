#include "models/mixtral/mixtral.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/autograd.h"
#include "engine/ops.h"

namespace mammoth::models {

using engine::Tensor;
using engine::nn::Embedding;
using engine::nn::Linear;
using engine::nn::RMSNorm;

MixtralExpert::MixtralExpert(const ModelConfig& c) {
  w1 = register_module("w1", std::make_shared<Linear>(c.d_model, c.d_ff, false, c.dtype));
  w2 = register_module("w2", std::make_shared<Linear>(c.d_ff, c.d_model, false, c.dtype));
  w3 = register_module("w3", std::make_shared<Linear>(c.d_model, c.d_ff, false, c.dtype));
}

MixtralSparseMoeBlock::MixtralSparseMoeBlock(const ModelConfig& c) : config_(c) {
  gate =
      register_module("gate", std::make_shared<Linear>(c.d_model, c.moe_experts, false, c.dtype));
  experts = register_module("experts", std::make_shared<ModuleList<MixtralExpert>>());
  for (int64_t e = 0; e < c.moe_experts; ++e) experts->add(std::make_shared<MixtralExpert>(c));
}

Tensor MixtralSparseMoeBlock::forward(const Tensor& x) {
  const int64_t C = x.size(-1), E = config_.moe_experts, k = config_.moe_top_k;
  const Tensor h = x.reshape({-1, C});  // [N, C]
  const int64_t N = h.size(0);
  // The router in f32 at least (HF softmaxes in float32), f64 for f64 models.
  router_logits = gate->forward(h);  // [N, E]
  const DType rdt = router_logits.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  if (router_logits.dtype() != rdt) router_logits = engine::cast(router_logits, rdt);
  router_probs = engine::softmax(router_logits, -1);

  // Top-k per token on the host (a selection, no gradient), larger probability first.
  const std::vector<double> p = router_probs.detach().to(Device::cpu()).to_vector();
  selected.assign(static_cast<size_t>(N * k), 0);
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    std::iota(order.begin(), order.end(), 0);
    const double* row = p.data() + n * E;
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [row](int64_t a, int64_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    std::copy(order.begin(), order.begin() + k, selected.begin() + n * k);
  }
  // Renormalised top-k weights [N * k], differentiable through the softmax.
  Tensor top = engine::gather(router_probs, 1, Tensor::from_ints(selected, {N, k}));
  top = (top / engine::sum(top, {1}, true)).reshape({N * k});

  // (token, expert) pairs sorted by expert, token order within one; capacity drops the tail.
  const int64_t capacity =
      config_.moe_capacity_factor > 0
          ? static_cast<int64_t>(std::ceil(config_.moe_capacity_factor *
                                           static_cast<double>(N * k) / static_cast<double>(E)))
          : N;
  load.tokens.assign(static_cast<size_t>(E), 0);
  load.dropped = 0;
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(E));  // n * k + rank
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = selected[n * k + j];
      ++load.tokens[e];
      if (static_cast<int64_t>(slots[e].size()) < capacity)
        slots[e].push_back(n * k + j);
      else
        ++load.dropped;
    }
  }
  std::vector<int64_t> offsets = {0}, rows, pair;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s : slots[e]) {
      rows.push_back(s / k);
      pair.push_back(s);
    }
    offsets.push_back(static_cast<int64_t>(rows.size()));
  }
  const int64_t M = offsets.back();
  const Tensor row_index = Tensor::from_ints(rows, {M}).to(x.device());
  const Tensor weights = engine::cast(
      engine::index_select(top, 0, Tensor::from_ints(pair, {M}).to(x.device())), x.dtype());
  const Tensor xs = engine::index_select(h, 0, row_index);  // [M, C]
  const Tensor ys = ep_group_ != nullptr && ep_group_->size() > 1
                        ? experts_parallel(xs, offsets)
                        : experts_forward(xs, offsets);  // [M, C]
  return engine::moe_combine(ys, row_index, weights, N).view(x.shape());
}

namespace {

// Rows [sum(send_rows), C] to the ranks of `group` (send_rows[j] rows to rank j, in order),
// returning the rows received [sum(recv_rows), C] in rank order; the backward sends the
// gradients back the same way. The backward runs (with zeros) even for a rank whose rows did
// not reach its loss, since its peers wait for it.
Tensor exchange_rows(const Tensor& x, parallel::Communicator& group,
                     const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows) {
  const int64_t C = x.size(1);
  const auto elements = [C](const std::vector<int64_t>& rows) {
    std::vector<int64_t> out;
    for (int64_t r : rows) out.push_back(r * C);
    return out;
  };
  const std::vector<int64_t> send = elements(send_rows), recv = elements(recv_rows);
  int64_t total = 0;
  for (int64_t r : recv_rows) total += r;
  const Tensor in = x.detach().contiguous();
  Tensor y = Tensor::empty({total, C}, x.dtype(), x.device());
  group.all_to_all_v(in, send, y, recv);
  if (engine::needs_grad({x})) {
    parallel::Communicator* g = &group;
    engine::record("collective", {x}, {&y},
                   [g, send, recv, shape = x.shape(), total, C, dtype = x.dtype(),
                    device = x.device()](const std::vector<Tensor>& gy) {
                     const Tensor dy = gy[0].defined() ? gy[0].contiguous()
                                                       : Tensor::zeros({total, C}, dtype, device);
                     Tensor dx = Tensor::empty(shape, dtype, device);
                     g->all_to_all_v(dy, recv, dx, send);
                     return std::vector<Tensor>{dx};
                   });
  }
  return y;
}

}  // namespace

void MixtralSparseMoeBlock::set_expert_group(parallel::Communicator* group) {
  MAMMOTH_CHECK(group == nullptr || config_.moe_experts % group->size() == 0)
      << "[Mixtral] --ep " << (group ? group->size() : 1) << " must divide the "
      << config_.moe_experts << " experts (num_local_experts) of '" << config_.name << "'";
  ep_group_ = group;
}

int64_t MixtralSparseMoeBlock::local_experts() const {
  return ep_group_ ? config_.moe_experts / ep_group_->size() : config_.moe_experts;
}

int64_t MixtralSparseMoeBlock::first_local_expert() const {
  return ep_group_ ? ep_group_->rank() * local_experts() : 0;
}

Tensor MixtralSparseMoeBlock::experts_forward(const Tensor& xs,
                                              const std::vector<int64_t>& offsets) {
  std::vector<Tensor> w1, w2, w3;
  for (size_t e = 0; e < experts->size(); ++e) {
    w1.push_back((*experts)[e].w1->weight);
    w2.push_back((*experts)[e].w2->weight);
    w3.push_back((*experts)[e].w3->weight);
  }
  const Tensor act = engine::silu(engine::grouped_matmul(xs, offsets, w1)) *
                     engine::grouped_matmul(xs, offsets, w3);
  return engine::grouped_matmul(act, offsets, w2);
}

Tensor MixtralSparseMoeBlock::experts_parallel(const Tensor& xs,
                                               const std::vector<int64_t>& offsets) {
  parallel::Communicator& g = *ep_group_;
  const int64_t P = g.size(), L = local_experts(), first = first_local_expert();
  // Rows per expert, grouped by the rank that owns it: [P * L], peer j's block is its experts.
  std::vector<int64_t> mine(static_cast<size_t>(P * L));
  for (int64_t e = 0; e < P * L; ++e) mine[e] = offsets[e + 1] - offsets[e];
  const Tensor counts_in = Tensor::from_ints(mine, {P * L}).to(xs.device());
  Tensor counts_out = Tensor::empty({P * L}, DType::kI64, xs.device());
  g.all_to_all(counts_in, counts_out);
  // theirs[i * L + e]: rows rank i sends to my local expert e.
  const std::vector<double> theirs_d = counts_out.to(Device::cpu()).to_vector();
  std::vector<int64_t> theirs(theirs_d.begin(), theirs_d.end());
  std::vector<int64_t> send_rows(P, 0), recv_rows(P, 0);
  for (int64_t j = 0; j < P; ++j) {
    for (int64_t e = 0; e < L; ++e) {
      send_rows[j] += mine[j * L + e];
      recv_rows[j] += theirs[j * L + e];
    }
  }
  const Tensor xr = exchange_rows(xs, g, send_rows, recv_rows);  // [R, C], by (source, expert)
  // Into (local expert, source) order for the grouped GEMM, and back after it.
  std::vector<int64_t> source_start(P, 0);
  for (int64_t j = 1; j < P; ++j) source_start[j] = source_start[j - 1] + recv_rows[j - 1];
  std::vector<int64_t> perm, local_offsets = {0};
  for (int64_t e = 0; e < L; ++e) {
    for (int64_t j = 0; j < P; ++j) {
      int64_t start = source_start[j];
      for (int64_t f = 0; f < e; ++f) start += theirs[j * L + f];
      for (int64_t m = 0; m < theirs[j * L + e]; ++m) perm.push_back(start + m);
    }
    local_offsets.push_back(static_cast<int64_t>(perm.size()));
  }
  const int64_t R = static_cast<int64_t>(perm.size());
  std::vector<int64_t> inverse(perm.size());
  for (int64_t i = 0; i < R; ++i) inverse[perm[i]] = i;
  const Tensor xe = engine::index_select(xr, 0, Tensor::from_ints(perm, {R}).to(xs.device()));
  std::vector<Tensor> w1, w2, w3;
  for (int64_t e = first; e < first + L; ++e) {
    w1.push_back((*experts)[e].w1->weight);
    w2.push_back((*experts)[e].w2->weight);
    w3.push_back((*experts)[e].w3->weight);
  }
  const Tensor act = engine::silu(engine::grouped_matmul(xe, local_offsets, w1)) *
                     engine::grouped_matmul(xe, local_offsets, w3);
  const Tensor ye = engine::grouped_matmul(act, local_offsets, w2);  // [R, C]
  const Tensor yr = engine::index_select(ye, 0, Tensor::from_ints(inverse, {R}).to(xs.device()));
  return exchange_rows(yr, g, recv_rows, send_rows);  // [M, C], in xs's order
}

MixtralDecoderLayer::MixtralDecoderLayer(const ModelConfig& c, const Layers& L) {
  input_layernorm =
      register_module("input_layernorm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps, c.dtype));
  self_attn = register_module("self_attn", std::make_shared<LlamaAttention>(c, L));
  post_attention_layernorm = register_module(
      "post_attention_layernorm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps, c.dtype));
  block_sparse_moe =
      register_module("block_sparse_moe", std::make_shared<MixtralSparseMoeBlock>(c));
}

Tensor MixtralDecoderLayer::forward(const Tensor& x, KVCache* cache, int64_t layer) const {
  Tensor h = x + self_attn->forward(input_layernorm->forward(x), cache, layer);
  return h + block_sparse_moe->forward(post_attention_layernorm->forward(h));
}

MixtralModel::MixtralModel(const ModelConfig& c) : config_(c) {
  embed_tokens = register_module("embed_tokens",
                                 std::make_shared<Embedding>(c.vocab_size, c.d_model, c.dtype));
  layers = register_module("layers", std::make_shared<ModuleList<MixtralDecoderLayer>>());
  for (int64_t l = 0; l < c.n_layer; ++l) layers->add(std::make_shared<MixtralDecoderLayer>(c));
  norm = register_module("norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps, c.dtype));
}

Tensor MixtralModel::forward(const Tensor& ids, KVCache* cache) const {
  MAMMOTH_CHECK(ids.dim() == 2 && ids.dtype() == DType::kI64)
      << "[Mixtral::forward] ids must be i64 [B, T], got " << dtype_name(ids.dtype()) << " "
      << engine::shape_str(ids.shape());
  const int64_t offset = cache != nullptr ? cache->length : 0;
  MAMMOTH_CHECK(offset + ids.size(1) <= config_.position_limit())
      << "[Mixtral::forward] positions up to " << offset + ids.size(1) << " exceed max_seq "
      << config_.max_seq;
  Tensor x = embed_tokens->forward(ids);
  for (size_t l = 0; l < layers->size(); ++l) x = (*layers)[l].forward(x, cache, l);
  if (cache != nullptr) cache->length += ids.size(1);
  return norm->forward(x);
}

Mixtral::Mixtral(ModelConfig config) : config_(std::move(config)) {
  config_.validate();
  MAMMOTH_CHECK(config_.family == Family::kMixtral)
      << "[Mixtral] config '" << config_.name << "' is family " << family_name(config_.family);
  model = register_module("model", std::make_shared<MixtralModel>(config_));
  if (!config_.tie_embeddings) {
    lm_head = register_module(
        "lm_head",
        std::make_shared<Linear>(config_.d_model, config_.vocab_size, false, config_.dtype));
  }
}

Tensor Mixtral::run(const Tensor& ids, KVCache* cache) {
  // Recomputing a block would run its router again under no grad and lose the router losses'
  // graph; refused until the router state is carried through engine::nn::checkpoint.
  MAMMOTH_CHECK(!is_training() || recompute_blocks_ == 0)
      << "[Mixtral] activation checkpointing (--recompute-blocks) is not supported for mixtral yet";
  Tensor h = model->forward(ids, cache);
  return lm_head ? lm_head->forward(h) : engine::linear(h, model->embed_tokens->weight);
}

Tensor Mixtral::forward(const Tensor& ids) { return run(ids, nullptr); }

Tensor Mixtral::forward_cached(const Tensor& ids, KVCache* cache) {
  MAMMOTH_CHECK(cache != nullptr) << "[Mixtral::forward_cached] cache is null";
  return run(ids, cache);
}

Tensor Mixtral::loss(const Tensor& ids, const Tensor& targets) {
  return with_router_losses(LanguageModel::loss(ids, targets), config_, *model);
}

Tensor Mixtral::aux_loss() const { return moe_aux_loss(router_sums(*model)); }

Tensor Mixtral::z_loss() const { return moe_z_loss(router_sums(*model)); }

std::vector<ExpertLoad> Mixtral::expert_load() const { return router_report(*model, nullptr).load; }

void Mixtral::set_expert_parallel(parallel::Communicator* group) {
  models::set_expert_parallel(*model, group);
}

Tensor pack_stage(const Tensor& x, const RouterSums& s, int64_t E) {
  const DType dt = x.dtype();
  MAMMOTH_CHECK(dt == DType::kF32 || dt == DType::kF64)
      << "[Mixtral::pipeline] the hidden states between stages are " << dtype_name(dt)
      << "; the router sums travel with them in f32 or f64 only (no --amp under --pp)";
  MAMMOTH_CHECK(dt == DType::kF64 || static_cast<double>(s.rows) * static_cast<double>(E) < 16e6)
      << "[Mixtral::pipeline] " << s.rows << " router rows: the choice counts would not be exact "
      << "in f32 between stages";
  const Device dev = x.device();
  std::vector<double> counts = s.choices;
  counts.resize(static_cast<size_t>(E), 0.0);
  counts.push_back(static_cast<double>(s.rows));
  return engine::concat(
      {x.reshape({-1}), s.probs.defined() ? engine::cast(s.probs, dt) : Tensor::zeros({E}, dt, dev),
       s.lse_sq.defined() ? engine::cast(s.lse_sq, dt) : Tensor::zeros({1}, dt, dev),
       Tensor::from_vector(counts, {E + 1}, dt).to(dev)},
      0);
}

std::pair<Tensor, RouterSums> unpack_stage(const Tensor& packed, const Tensor& ids,
                                           const ModelConfig& c) {
  const int64_t B = ids.size(0), T = ids.size(1) - 1, C = c.d_model, E = c.moe_experts;
  const int64_t n = B * T * C;
  MAMMOTH_CHECK(packed.dim() == 1 && packed.size(0) == n + 2 * E + 2)
      << "[Mixtral::pipeline] a stage's activation is one row of " << n + 2 * E + 2
      << " values (hidden states [" << B << ", " << T << ", " << C << "] and router sums), got "
      << engine::shape_str(packed.shape());
  RouterSums s;
  s.probs = packed.slice(0, n, n + E);
  s.lse_sq = packed.slice(0, n + E, n + E + 1);
  const std::vector<double> counts =
      packed.slice(0, n + E + 1, n + 2 * E + 2).detach().to(Device::cpu()).to_vector();
  s.choices.assign(counts.begin(), counts.end() - 1);
  s.rows = static_cast<int64_t>(counts.back());
  return {packed.slice(0, 0, n).reshape({B, T, C}), std::move(s)};
}

namespace {

// The blocks after a forward (the router state the losses read).
std::vector<MixtralSparseMoeBlock*> routed_blocks(const engine::nn::Module& model) {
  std::vector<MixtralSparseMoeBlock*> out = moe_blocks(model);
  for (const MixtralSparseMoeBlock* b : out)
    MAMMOTH_CHECK(b->router_probs.defined()) << "[Mixtral] router losses need a forward first";
  return out;
}

}  // namespace

Tensor Mixtral::pipeline_embed(const Tensor& ids) {
  // The window's inputs only: routing its last token, which predicts nothing, would count it
  // in the router losses and the capacity as one process does not.
  const int64_t T = ids.size(1) - 1;
  MAMMOTH_CHECK(T >= 1 && T <= config_.position_limit())
      << "[Mixtral::pipeline_embed] a window of " << ids.size(1) << " tokens: " << T
      << " positions, max_seq " << config_.max_seq;
  return pack_stage(model->embed_tokens->forward(ids.slice(1, 0, T)), RouterSums{},
                    config_.moe_experts);
}

Tensor Mixtral::pipeline_block(int64_t l, const Tensor& x, const Tensor& ids) {
  MAMMOTH_CHECK(!is_training() || recompute_blocks_ == 0)
      << "[Mixtral] activation checkpointing (--recompute-blocks) is not supported for mixtral yet";
  auto [h, sums] = unpack_stage(x, ids, config_);
  const MixtralDecoderLayer& layer = (*model->layers)[static_cast<size_t>(l)];
  h = layer.forward(h, nullptr, l);
  // This micro-batch's router state, read before another micro-batch's forward replaces it.
  sums.add(*layer.block_sparse_moe);
  return pack_stage(h, sums, config_.moe_experts);
}

Tensor Mixtral::pipeline_loss(const Tensor& x, const Tensor& ids) {
  const auto [h, sums] = unpack_stage(x, ids, config_);
  const int64_t T = ids.size(1);
  const Tensor n = model->norm->forward(h);
  const Tensor logits =
      lm_head ? lm_head->forward(n) : engine::linear(n, model->embed_tokens->weight);
  return with_router_losses(engine::cross_entropy(logits, ids.slice(1, 1, T)), config_, sums);
}

LanguageModel::PipelinePart Mixtral::pipeline_part(const std::string& name) const {
  return llama_pipeline_part(name, config_.tie_embeddings);
}

std::vector<MixtralSparseMoeBlock*> moe_blocks(const engine::nn::Module& model) {
  std::vector<MixtralSparseMoeBlock*> out;
  for (const auto& [name, m] : model.named_modules()) {
    if (auto* b = dynamic_cast<MixtralSparseMoeBlock*>(m.get())) out.push_back(b);
  }
  MAMMOTH_CHECK(!out.empty()) << "[Mixtral] the model has no mixture-of-experts block";
  return out;
}

void RouterSums::add(const MixtralSparseMoeBlock& b) {
  MAMMOTH_CHECK(b.router_probs.defined()) << "[Mixtral] router losses need a forward first";
  const Tensor p = engine::sum(b.router_probs, {0});  // [E]
  probs = probs.defined() ? probs + p : p;
  // logsumexp with the (constant) row maximum taken out first.
  const Tensor z = b.router_logits;
  const Tensor m = engine::max(z, 1, true).detach();
  const Tensor lse = engine::log(engine::sum(engine::exp(z - m), {1}, true)) + m;
  const Tensor sq = engine::sum(lse * lse).reshape({1});
  lse_sq = lse_sq.defined() ? lse_sq + sq : sq;
  choices.resize(static_cast<size_t>(p.size(0)), 0.0);
  for (int64_t e : b.selected) choices[static_cast<size_t>(e)] += 1;
  rows += b.router_probs.size(0);
}

RouterSums router_sums(const engine::nn::Module& model) {
  RouterSums s;
  for (const MixtralSparseMoeBlock* b : routed_blocks(model)) s.add(*b);
  return s;
}

Tensor moe_aux_loss(const RouterSums& s) {
  // HF's load_balancing_loss_func without an attention mask, over the layers' rows stacked:
  // E * sum_e (fraction of the top-k choices that went to e) * (mean router probability of e),
  // the fraction taken per rank j and summed over j, i.e. choices_e / rows.
  MAMMOTH_CHECK(s.rows > 0) << "[Mixtral] router losses need a forward first";
  const int64_t E = s.probs.size(0);
  const double rows = static_cast<double>(s.rows);
  std::vector<double> frac = s.choices;
  for (double& c : frac) c /= rows;
  const Tensor f = Tensor::from_vector(frac, {E}, s.probs.dtype()).to(s.probs.device());
  return engine::sum(s.probs / rows * f) * static_cast<double>(E);
}

Tensor moe_z_loss(const RouterSums& s) {
  MAMMOTH_CHECK(s.rows > 0) << "[Mixtral] router losses need a forward first";
  return engine::sum(s.lse_sq) / static_cast<double>(s.rows);
}

Tensor with_router_losses(const Tensor& loss, const ModelConfig& c, const RouterSums& s) {
  Tensor l = loss;
  if (c.moe_aux_loss && c.moe_aux_loss_coef > 0) l = l + moe_aux_loss(s) * c.moe_aux_loss_coef;
  if (c.moe_z_loss_coef > 0) l = l + moe_z_loss(s) * c.moe_z_loss_coef;
  return l;
}

Tensor with_router_losses(const Tensor& loss, const ModelConfig& c,
                          const engine::nn::Module& model) {
  if ((!c.moe_aux_loss || c.moe_aux_loss_coef <= 0) && c.moe_z_loss_coef <= 0) return loss;
  return with_router_losses(loss, c, router_sums(model));
}

RouterReport router_report(const engine::nn::Module& model, parallel::Communicator* stages) {
  const std::vector<MixtralSparseMoeBlock*> blocks = moe_blocks(model);
  const int64_t L = static_cast<int64_t>(blocks.size());
  int64_t E = 0;
  RouterSums sums;
  std::vector<double>
      v;  // per layer: tokens per expert, dropped; then probs, lse_sq, choices, rows
  for (const MixtralSparseMoeBlock* b : blocks) E = std::max<int64_t>(E, b->experts->size());
  v.assign(static_cast<size_t>(L * (E + 1) + 2 * E + 2), 0.0);
  for (int64_t l = 0; l < L; ++l) {
    const MixtralSparseMoeBlock& b = *blocks[static_cast<size_t>(l)];
    // Under pipeline stages the other stages' blocks never ran here.
    if (!b.router_probs.defined()) {
      MAMMOTH_CHECK(stages != nullptr) << "[Mixtral] router losses need a forward first";
      continue;
    }
    for (int64_t e = 0; e < E; ++e) v[l * (E + 1) + e] = static_cast<double>(b.load.tokens[e]);
    v[l * (E + 1) + E] = static_cast<double>(b.load.dropped);
    sums.add(b);
  }
  double* tail = v.data() + L * (E + 1);
  if (sums.rows > 0) {
    const std::vector<double> p = sums.probs.detach().to(Device::cpu()).to_vector();
    std::copy(p.begin(), p.end(), tail);
    tail[E] = sums.lse_sq.detach().to(Device::cpu()).to_vector()[0];
    std::copy(sums.choices.begin(), sums.choices.end(), tail + E + 1);
    tail[2 * E + 1] = static_cast<double>(sums.rows);
  }
  if (stages != nullptr && stages->size() > 1) {
    Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::kF64);
    stages->all_reduce(t, parallel::ReduceOp::kSum);
    v = t.to_vector();
    tail = v.data() + L * (E + 1);
  }
  RouterReport r;
  for (int64_t l = 0; l < L; ++l) {
    ExpertLoad load;
    for (int64_t e = 0; e < E; ++e) load.tokens.push_back(static_cast<int64_t>(v[l * (E + 1) + e]));
    load.dropped = static_cast<int64_t>(v[l * (E + 1) + E]);
    r.load.push_back(std::move(load));
  }
  RouterSums all;
  all.probs = Tensor::from_vector(std::vector<double>(tail, tail + E), {E}, DType::kF64);
  all.lse_sq = Tensor::from_vector({tail[E]}, {1}, DType::kF64);
  all.choices.assign(tail + E + 1, tail + 2 * E + 1);
  all.rows = static_cast<int64_t>(tail[2 * E + 1]);
  engine::NoGradGuard ng;
  r.aux_loss = moe_aux_loss(all).item();
  r.z_loss = moe_z_loss(all).item();
  return r;
}

void set_expert_parallel(const engine::nn::Module& model, parallel::Communicator* group) {
  for (MixtralSparseMoeBlock* b : moe_blocks(model)) b->set_expert_group(group);
}

int64_t Mixtral::expert_of(const std::string& name) {
  const std::string key = ".block_sparse_moe.experts.";
  const size_t at = name.find(key);
  if (at == std::string::npos) return -1;
  return std::stoll(name.substr(at + key.size()));
}

HfLayout Mixtral::hf_layout() const {
  HfLayout layout = Model::hf_layout();
  layout.ignored = {"*.rotary_emb.inv_freq"};
  if (config_.tie_embeddings) layout.ignored.push_back("lm_head.weight");
  return layout;
}

}  // namespace mammoth::models
