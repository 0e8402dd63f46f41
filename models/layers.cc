#include "models/layers.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/nn/rng.h"
#include "parallel/sequence_parallel/sequence_parallel.h"
#include "parallel/tensor_parallel/layers.h"

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

Layers::Layers(parallel::Communicator& tp, SpMode mode) : tp_(&tp), mode_(mode) {}

int64_t Layers::split(int64_t n, const char* what) const {
  MAMMOTH_CHECK(n % tp() == 0) << "[layers] " << what << " " << n << " does not divide by tp "
                               << tp();
  return n / tp();
}

std::shared_ptr<engine::nn::Linear> Layers::column(int64_t in, int64_t out, bool bias, DType dtype,
                                                   const LinearOptions& o) const {
  if (tp() == 1) return local(in, out, bias, dtype, o);
  return std::make_shared<parallel::ColumnParallelLinear>(
      in, out, bias, dtype, *tp_,
      parallel::ColumnParallelLinear::Options{.sequence_parallel = mode_ == SpMode::kSplitGather,
                                              .parts = o.parts});
}

std::shared_ptr<engine::nn::Linear> Layers::row(int64_t in, int64_t out, bool bias, DType dtype,
                                                const LinearOptions& o) const {
  if (tp() == 1) return local(in, out, bias, dtype, o);
  return std::make_shared<parallel::RowParallelLinear>(
      in, out, bias, dtype, *tp_,
      parallel::RowParallelLinear::Options{.sequence_parallel = mode_ == SpMode::kSplitGather});
}

std::shared_ptr<engine::nn::Linear> Layers::local(int64_t in, int64_t out, bool bias, DType dtype,
                                                  const LinearOptions& o) {
  if (o.init_std > 0) return std::make_shared<ScaledLinear>(in, out, bias, dtype, o.init_std);
  return std::make_shared<engine::nn::Linear>(in, out, bias, dtype);
}

Tensor Layers::attention(const Tensor& q, const Tensor& k, const Tensor& v,
                         engine::AttentionOptions options, double dropout, bool training,
                         const SeqContext& seq) const {
  if (seq.mode == SpMode::kUlysses || seq.mode == SpMode::kRing) {
    MAMMOTH_CHECK(seq.sp && seq.layout)
        << "[layers] " << sp_mode_name(seq.mode) << " attention without its sp group and layout";
    MAMMOTH_CHECK(!options.key_mask.defined())
        << "[layers] a key mask under " << sp_mode_name(seq.mode)
        << " comes in SeqContext::key_mask, over the whole padded sequence";
    MAMMOTH_CHECK(dropout == 0.0 || !training)
        << "[layers] attention dropout " << dropout << " under " << sp_mode_name(seq.mode)
        << " is not supported (Ulysses and ring attention have no dropout); train with "
           "--dropout 0 or --sp-mode split_gather";
    const auto run =
        seq.mode == SpMode::kUlysses ? parallel::ulysses_attention : parallel::ring_attention;
    return run(q.contiguous(), k.contiguous(), v.contiguous(), *seq.sp, *seq.layout, options.causal,
               options.scale, options.window, seq.key_mask);
  }
  if (seq.key_mask.defined()) options.key_mask = seq.key_mask;
  return attend(q, k, v, options, dropout, training);
}

void ScaledLinear::init_own(uint64_t seed, const std::string& prefix) {
  engine::nn::init_normal(weight, seed, engine::nn::name_stream(prefix + "weight"), 0.0, stddev_);
  if (bias.defined()) engine::fill_(bias, 0.0);
}

Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v,
              const engine::AttentionOptions& options, double dropout_p, bool training) {
  if (!training || dropout_p == 0.0) return engine::attention(q, k, v, options);
  const int64_t B = q.size(0), Hq = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t Hk = k.size(1), Tk = k.size(2);
  MAMMOTH_CHECK(Hk > 0 && Hq % Hk == 0)
      << "[attend] query heads " << Hq << " must be a multiple of key heads " << Hk;
  Tensor kk = k, vv = v;
  if (Hk != Hq) {  // grouped-query: repeat each key/value head for its group of query heads
    const int64_t g = Hq / Hk;
    kk = k.unsqueeze(2).expand({B, Hk, g, Tk, D}).reshape({B, Hq, Tk, D});
    vv = v.unsqueeze(2).expand({B, Hk, g, Tk, D}).reshape({B, Hq, Tk, D});
  }
  const double scale = options.scale != 0.0 ? options.scale : 1.0 / std::sqrt(double(D));
  Tensor scores = engine::matmul(q, kk.transpose(2, 3)) * scale;  // [B, Hq, Tq, Tk]
  if (options.causal) {
    // Query i sits at position i + (Tk - Tq): it sees keys up to there (bottom-right aligned,
    // as engine::attention does for cached decoding), and, with a sliding window, none at or
    // before position - window.
    std::vector<double> future(static_cast<size_t>(Tq * Tk));
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t j = 0; j < Tk; ++j) {
        const int64_t at = i + (Tk - Tq);
        const bool slid_out = options.window > 0 && j <= at - options.window;
        future[i * Tk + j] = j > at || slid_out ? 1.0 : 0.0;
      }
    scores = engine::masked_fill(
        scores, Tensor::from_vector(future, {Tq, Tk}, DType::kBool).to(scores.device()), -1e30);
  }
  if (options.key_mask.defined()) {
    // keep 1 -> +0, pad 0 -> -1e30, broadcast over heads and queries
    Tensor bias = (engine::cast(options.key_mask, scores.dtype()) - 1.0) * 1e30;
    scores = scores + bias.view({B, 1, 1, Tk});
  }
  Tensor probs = engine::softmax(scores, -1);
  probs = engine::dropout(probs, dropout_p, engine::nn::rng_state().seed,
                          engine::nn::rng_reserve(probs.numel()), true);
  return engine::matmul(probs, vv);
}

Tensor split_heads(const Tensor& x, int64_t heads) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  return x.reshape({B, T, heads, C / heads}).permute({0, 2, 1, 3});
}

Tensor merge_heads(const Tensor& x) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  return x.permute({0, 2, 1, 3}).reshape({B, T, H * D});
}

Tensor positions(int64_t offset, int64_t t, Device device) {
  std::vector<int64_t> p(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) p[i] = offset + i;
  return Tensor::from_ints(p, {t}).to(device);
}

Device module_device(const engine::nn::Module& module) {
  const engine::nn::NamedTensors params = module.named_parameters();
  return params.empty() ? Device::cpu() : params.front().second.device();
}

}  // namespace mammoth::models
