#include "models/policies/policy.h"

#include <map>
#include <set>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "models/family.h"
#include "models/registry.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mammoth::models {

using engine::Tensor;

ShardLayout::ShardLayout(const engine::nn::Module& self, const parallel::DeviceMesh& mesh,
                         const ShardOptions& options)
    : mesh_(mesh), options_(options), self_(self) {
  const int sp = mesh.size(parallel::Axis::kSp);
  const bool sp_mode = options.sp_mode == SpMode::kUlysses || options.sp_mode == SpMode::kRing;
  MAMMOTH_CHECK(sp == 1 || sp_mode)
      << "[apply_policy] the mesh has sp=" << sp << " but --sp-mode is "
      << sp_mode_name(options.sp_mode) << "; use ulysses or ring (split_gather runs on tp)";
}

ShardedLanguageModel::ShardedLanguageModel(const parallel::DeviceMesh& mesh,
                                           const ShardOptions& options)
    : ShardLayout(*this, mesh, options) {}

ShardedDecoder::ShardedDecoder(const ModelConfig& config, const parallel::DeviceMesh& mesh,
                               const ShardOptions& options)
    : ShardedLanguageModel(mesh, options), config_(config) {}

HfLayout ShardedDecoder::hf_layout() const { return build_model(config_)->hf_layout(); }

const std::vector<int64_t>& ShardedDecoder::logit_rows(const SeqPlan& plan) const {
  return options_.sp_mode == SpMode::kSplitGather ? plan.every : plan.local;
}

ShardedDecoder::Local ShardedDecoder::run(const Tensor& ids) {
  Local out;
  Tensor x = pipeline_embed(ids);  // checks ids
  out.plan = plan_sequence(ids.size(1));
  for (int64_t l = 0; l < config_.n_layer; ++l) x = pipeline_block(l, x, ids);
  out.logits = local_logits(x);
  out.rows = logit_rows(out.plan);
  return out;
}

Tensor ShardedDecoder::forward(const Tensor& ids) {
  Local l = run(ids);
  return gather_logits(l.logits, l.plan, ids.size(1), config_.vocab_size);
}

Tensor ShardedDecoder::loss(const Tensor& ids, const Tensor& targets) {
  Local l = run(ids);
  return loss_from_local(l.logits, l.rows, ids, targets, vocab_start(), config_.vocab_size);
}

Tensor ShardedDecoder::pipeline_loss(const Tensor& x, const Tensor& ids) {
  return loss_from_local(local_logits(x), logit_rows(plan_sequence(ids.size(1))), ids, Tensor(),
                         vocab_start(), config_.vocab_size);
}

Tensor ShardedDecoder::forward_paged(const Tensor& ids, const std::vector<PagedSequence>& seqs,
                                     PagedKVCache* cache) {
  MAMMOTH_CHECK(supports_paged_kv())
      << "[forward_paged] model family " << family_name(config_.family)
      << " has no tensor-parallel paged KV cache (GPT-2 and LLaMA have)";
  MAMMOTH_CHECK(options_.sp_mode == SpMode::kNone)
      << "[forward_paged] serving runs under tp only, not sequence parallelism (--sp-mode "
      << sp_mode_name(options_.sp_mode) << ")";
  MAMMOTH_CHECK(cache != nullptr) << "[forward_paged] cache is null";
  const Tensor pos = paged_positions(ids, seqs, *cache, config_.max_seq, "forward_paged");
  Tensor x = paged_embed(ids, pos);
  for (int64_t l = 0; l < config_.n_layer; ++l) x = paged_block(l, x, seqs, cache);
  const Tensor local = local_logits(paged_last_rows(x, seqs));  // [1, S, Vp/tp]
  return parallel::gather_from_group(local, mesh_.group(parallel::Axis::kTp), -1)
      .slice(-1, 0, config_.vocab_size)
      .select(0, 0);  // [S, V]
}

int64_t ShardedDecoder::kv_cache_heads() const {
  const int64_t tp = mesh_.size(parallel::Axis::kTp);
  return config_.n_kv_head >= tp ? config_.n_kv_head / tp : 1;
}

Tensor ShardedDecoder::paged_embed(const Tensor&, const Tensor&) {
  MAMMOTH_THROW() << "[forward_paged] model family " << family_name(config_.family)
                  << " has no tensor-parallel paged KV cache";
}

Tensor ShardedDecoder::paged_block(int64_t, const Tensor&, const std::vector<PagedSequence>&,
                                   PagedKVCache*) {
  MAMMOTH_THROW() << "[forward_paged] model family " << family_name(config_.family)
                  << " has no tensor-parallel paged KV cache";
}

ShardedVit::ShardedVit(const parallel::DeviceMesh& mesh, const ShardOptions& options)
    : ShardLayout(*this, mesh, options) {}

parallel::ShardSpec ShardLayout::spec(const std::string& name) const {
  auto it = specs_.find(name);
  return it == specs_.end() ? parallel::ShardSpec{} : it->second;
}

void ShardLayout::set_replicated_heads(const std::string& name, int64_t heads, int64_t head_rows) {
  const int tp = mesh_.size(parallel::Axis::kTp);
  MAMMOTH_CHECK(heads > 0 && heads < tp && tp % heads == 0)
      << "[apply_policy] '" << name << "': " << heads << " heads cannot be replicated over tp "
      << tp << " (needs fewer heads than ranks, tp a multiple of them)";
  replicated_[name] = {heads, head_rows};
}

void ShardLayout::set_replicated_kv_heads(const std::string& prefix, const ModelConfig& c) {
  for (const char* kv : {"k_proj.", "v_proj."}) {
    set_replicated_heads(prefix + kv + "weight", c.n_kv_head, c.head_dim());
    if (c.qkv_bias) set_replicated_heads(prefix + kv + "bias", c.n_kv_head, c.head_dim());
  }
}

void ShardLayout::set_layer_specs() {
  for (const auto& [name, m] : self_.named_modules()) {
    auto set = [&](const std::string& param, const parallel::ShardSpec& s) {
      const std::string full = name + "." + param;
      if (replicated_heads(full) == nullptr) set_spec(full, s);
    };
    if (auto col = std::dynamic_pointer_cast<parallel::ColumnParallelLinear>(m)) {
      set("weight", col->weight_spec());
      if (col->bias.defined()) set("bias", col->weight_spec());  // [out]: split as W's rows
    } else if (auto row = std::dynamic_pointer_cast<parallel::RowParallelLinear>(m)) {
      set("weight", row->weight_spec());
    } else if (auto emb = std::dynamic_pointer_cast<parallel::VocabParallelEmbedding>(m)) {
      set("weight", emb->weight_spec());
    }
  }
}

const ShardLayout::ReplicatedHeads* ShardLayout::replicated_heads(const std::string& name) const {
  auto it = replicated_.find(name);
  return it == replicated_.end() ? nullptr : &it->second;
}

bool ShardLayout::holds_full(const std::string& name) const {
  if (mesh_.size(parallel::Axis::kTp) == 1) return true;  // one piece, unpadded
  return !spec(name).sharded() && replicated_heads(name) == nullptr;
}

bool ShardLayout::grad_owner(const std::string& name) const {
  const parallel::Communicator& tp = mesh_.group(parallel::Axis::kTp);
  if (spec(name).sharded()) return true;
  if (const ReplicatedHeads* r = replicated_heads(name)) {
    return tp.rank() % (tp.size() / r->heads) == 0;
  }
  return tp.rank() == 0;
}

Tensor ShardLayout::shard_of(const std::string& name, const Tensor& full) const {
  parallel::Communicator& tp = mesh_.group(parallel::Axis::kTp);
  engine::NoGradGuard ng;
  if (const ReplicatedHeads* r = replicated_heads(name)) {
    const int64_t head = tp.rank() / (tp.size() / r->heads);
    return full.detach()
        .slice(0, head * r->head_rows, (head + 1) * r->head_rows)
        .contiguous()
        .clone();
  }
  return parallel::shard_tensor(full.detach(), spec(name), tp.rank(), tp.size());
}

Tensor ShardLayout::full_tensor(const std::string& name, const Tensor& local) const {
  parallel::Communicator& tp = mesh_.group(parallel::Axis::kTp);
  engine::NoGradGuard ng;
  if (const ReplicatedHeads* r = replicated_heads(name)) {
    // Every rank's copy, rank-major; head h is the copy of rank h * (tp / heads).
    Tensor all = parallel::comm_ops::all_gather(local.detach().contiguous(), tp, 0);
    std::vector<Tensor> heads;
    const int64_t copies = tp.size() / r->heads;
    for (int64_t h = 0; h < r->heads; ++h) {
      const int64_t at = h * copies * r->head_rows;
      heads.push_back(all.slice(0, at, at + r->head_rows));
    }
    return engine::concat(heads, 0).contiguous();
  }
  return parallel::unshard_tensor(local.detach(), spec(name), tp);
}

void ShardLayout::load_from(const Model& full) {
  std::map<std::string, Tensor> mine;
  for (const auto& [name, t] : self_.named_parameters()) mine[name] = t;
  std::set<std::string> seen;
  engine::NoGradGuard ng;
  for (const auto& [name, t] : full.named_parameters()) {
    auto it = mine.find(name);
    MAMMOTH_CHECK(it != mine.end())
        << "[apply_policy] the sharded model has no parameter '" << name << "'";
    const Tensor shard = shard_of(name, t);
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

engine::nn::NamedTensors ShardLayout::full_parameters() const {
  engine::nn::NamedTensors out;
  for (const auto& [name, t] : self_.named_parameters())
    out.emplace_back(name, full_tensor(name, t));
  return out;
}

void ShardLayout::sync_grads() const {
  for (const auto& [name, t] : self_.named_parameters()) sync_grad(name, t);
}

void ShardLayout::sync_grad(const std::string& name, const Tensor& t) const {
  const bool split_gather = options_.sp_mode == SpMode::kSplitGather;
  parallel::Communicator& tp = mesh_.group(parallel::Axis::kTp);
  parallel::Communicator& sp = mesh_.group(parallel::Axis::kSp);
  Tensor g = t.grad();
  // A parameter the loss does not use (BERT's pooler under the MLM loss) has no gradient on
  // any rank (the graph is the same on all): nothing to sum, and the optimizer skips it as it
  // does on one device.
  if (!g.defined()) return;
  bool changed = false;
  if (const ReplicatedHeads* r = replicated_heads(name)) {
    // Each copy's gradient covers only its rank's query heads: sum the copies of each head
    // (placed in a full-size buffer, all-reduced over tp) and keep this rank's head.
    const int64_t head = tp.rank() / (tp.size() / r->heads);
    engine::Shape shape = g.shape();
    shape[0] = r->heads * r->head_rows;
    Tensor all = Tensor::zeros(shape, g.dtype(), g.device());
    engine::copy_(all.slice(0, head * r->head_rows, (head + 1) * r->head_rows), g);
    all = parallel::comm_ops::all_reduce(all, tp);
    g = all.slice(0, head * r->head_rows, (head + 1) * r->head_rows).contiguous();
    changed = true;
  } else if (split_gather && tp.size() > 1 && !spec(name).sharded()) {
    g = parallel::comm_ops::all_reduce(g, tp);
    changed = true;
  }
  if (sp.size() > 1) {
    g = parallel::comm_ops::all_reduce(g, sp);
    changed = true;
  }
  if (changed) t.set_grad(g);
}

ShardLayout::SeqPlan ShardLayout::plan_sequence(int64_t T) const {
  parallel::Communicator& tp = mesh_.group(parallel::Axis::kTp);
  parallel::Communicator& sp = mesh_.group(parallel::Axis::kSp);
  int parts = 1;
  SeqPlan plan;
  parallel::SeqSplit split = parallel::SeqSplit::kContiguous;
  if (options_.sp_mode == SpMode::kSplitGather) {
    parts = tp.size();
    plan.part = tp.rank();
  } else if (sequence_on_sp()) {
    parts = sp.size();
    plan.part = sp.rank();
    if (options_.sp_mode == SpMode::kRing) split = parallel::SeqSplit::kZigzag;
  }
  plan.layout = std::make_shared<parallel::SequenceLayout>(T, parts, split);
  plan.local = plan.layout->positions(plan.part);
  plan.every.resize(static_cast<size_t>(plan.layout->padded()));
  for (int64_t i = 0; i < plan.layout->padded(); ++i) plan.every[i] = i;
  return plan;
}

SeqContext ShardLayout::encoder_context(const SeqPlan& plan, int64_t batch, Device device,
                                        const Tensor& attention_mask) const {
  SeqContext seq{
      .mode = options_.sp_mode, .layout = plan.layout, .sp = &mesh_.group(parallel::Axis::kSp)};
  const int64_t length = plan.layout->length(), padded = plan.layout->padded();
  // Ulysses and ring hide the layout's padding themselves; split_gather attends locally.
  const bool pads = options_.sp_mode == SpMode::kSplitGather && padded > length;
  if (!pads && !attention_mask.defined()) return seq;
  MAMMOTH_CHECK(!attention_mask.defined() ||
                attention_mask.shape() == engine::Shape({batch, length}))
      << "[encoder] attention_mask " << engine::shape_str(attention_mask.shape()) << " must be ["
      << batch << ", " << length << "]";
  const std::vector<double> given = attention_mask.defined()
                                        ? engine::cast(attention_mask, DType::kF64).to_vector()
                                        : std::vector<double>();
  std::vector<double> keep(static_cast<size_t>(batch * padded), 0.0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < length; ++t) {
      keep[b * padded + t] = given.empty() || given[b * length + t] != 0 ? 1.0 : 0.0;
    }
  }
  seq.key_mask = Tensor::from_vector(keep, {batch, padded}, DType::kBool).to(device);
  return seq;
}

parallel::Communicator& ShardLayout::sequence_group() const {
  return mesh_.group(options_.sp_mode == SpMode::kSplitGather ? parallel::Axis::kTp
                                                              : parallel::Axis::kSp);
}

Tensor ShardedLanguageModel::ids_at(const Tensor& ids, const std::vector<int64_t>& pos) {
  const int64_t B = ids.size(0), T = ids.size(1);
  std::vector<int64_t> all = ids.to_int_vector();
  std::vector<int64_t> v;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t p : pos) v.push_back(p < T ? all[b * T + p] : 0);
  return Tensor::from_ints(v, {B, static_cast<int64_t>(pos.size())}).to(ids.device());
}

Tensor ShardedLanguageModel::loss_from_local(const Tensor& logits, const std::vector<int64_t>& rows,
                                             const Tensor& ids, const Tensor& targets,
                                             int64_t vocab_start, int64_t vocab_size) const {
  const int64_t B = ids.size(0), T = ids.size(1);
  // Targets over the whole sequence: the next token, or the given labels; -100 = no loss.
  std::vector<int64_t> tg(static_cast<size_t>(B * T), -100);
  if (targets.defined()) {
    tg = targets.to_int_vector();
  } else {
    std::vector<int64_t> v = ids.to_int_vector();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t + 1 < T; ++t) tg[b * T + t] = v[b * T + t + 1];
  }
  int64_t count = 0;
  for (int64_t x : tg) count += x != -100 ? 1 : 0;
  MAMMOTH_CHECK(count > 0) << "[ShardedLanguageModel::loss] no target positions";
  std::vector<int64_t> mine;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t p : rows) mine.push_back(p < T ? tg[b * T + p] : -100);
  const int64_t n = static_cast<int64_t>(rows.size());
  Tensor per_row = parallel::vocab_parallel_cross_entropy(
      logits, Tensor::from_ints(mine, {B, n}).to(logits.device()), mesh_.group(parallel::Axis::kTp),
      vocab_start, vocab_size);
  Tensor total = engine::sum(per_row);
  if (sequence_on_sp()) {
    total = parallel::reduce_from_group(total, mesh_.group(parallel::Axis::kSp));
  }
  return total / static_cast<double>(count);
}

Tensor ShardedLanguageModel::gather_logits(const Tensor& logits, const SeqPlan& plan, int64_t T,
                                           int64_t vocab_size) const {
  Tensor full = parallel::gather_from_group(logits, mesh_.group(parallel::Axis::kTp), -1)
                    .slice(-1, 0, vocab_size);
  if (sequence_on_sp()) {
    return parallel::gather_sequence(full, 1, *plan.layout, mesh_.group(parallel::Axis::kSp));
  }
  return full.slice(1, 0, T);
}

namespace {

std::map<Family, PolicyFn>& policies() {
  static std::map<Family, PolicyFn> p;
  return p;
}

}  // namespace

bool register_policy(Family family, PolicyFn policy) {
  MAMMOTH_CHECK(policy != nullptr && policies().emplace(family, policy).second)
      << "[register_policy] family '" << family_name(family)
      << "' has a tensor-parallel policy already (or none was given)";
  return true;
}

std::shared_ptr<ShardedLanguageModel> apply_policy(const Model& model,
                                                   const parallel::DeviceMesh& mesh,
                                                   const ShardOptions& options) {
  const Family family = model.config().family;
  MAMMOTH_CHECK(family_spec(family).language_model)
      << "[apply_policy] " << family_name(family)
      << " is not a language model: use its family's own policy (vit_policy for vit)";
  auto it = policies().find(family);
  MAMMOTH_CHECK(it != policies().end())
      << "[apply_policy] no sharding policy for family '" << family_name(family) << "' yet";
  return it->second(model, mesh, options);
}

}  // namespace mammoth::models
