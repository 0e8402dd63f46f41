#include "models/family.h"

#include <algorithm>
#include <utility>

#include "base/error.h"

namespace mammoth::models {
namespace {

std::vector<FamilySpec>& mutable_families() {
  static std::vector<FamilySpec> f;
  return f;
}

}  // namespace

bool register_family(FamilySpec spec) {
  std::vector<FamilySpec>& all = mutable_families();
  const FamilyCost& k = spec.cost;
  MAMMOTH_CHECK(spec.build && spec.from_hf && spec.to_hf && !spec.hf_model_types.empty())
      << "[register_family] " << spec.name
      << ": a family needs build, from_hf, to_hf and its model_types";
  MAMMOTH_CHECK(k.block_params && k.outside_params && k.embedding_params && k.block_flops &&
                k.head_flops && k.default_seq_len && k.tp_split && k.activations)
      << "[register_family] " << spec.name << ": every cost function must be set (FamilyCost)";
  for (const FamilySpec& f : all) {
    MAMMOTH_CHECK(f.family != spec.family && std::string(f.name) != spec.name)
        << "[register_family] " << spec.name << ": tag " << static_cast<int>(spec.family)
        << " or name taken by " << f.name;
    for (const std::string& t : spec.hf_model_types) {
      MAMMOTH_CHECK(std::find(f.hf_model_types.begin(), f.hf_model_types.end(), t) ==
                    f.hf_model_types.end())
          << "[register_family] " << spec.name << ": model_type '" << t << "' is " << f.name
          << "'s";
    }
  }
  all.push_back(std::move(spec));
  std::sort(all.begin(), all.end(), [](const FamilySpec& a, const FamilySpec& b) {
    return static_cast<int>(a.family) < static_cast<int>(b.family);
  });
  return true;
}

const std::vector<FamilySpec>& families() { return mutable_families(); }

const FamilySpec& family_spec(Family f) {
  for (const FamilySpec& s : families())
    if (s.family == f) return s;
  MAMMOTH_THROW() << "[models] no model family registered with tag " << static_cast<int>(f);
}

const FamilySpec* family_for_model_type(const std::string& type) {
  for (const FamilySpec& s : families())
    for (const std::string& t : s.hf_model_types)
      if (t == type) return &s;
  return nullptr;
}

namespace cost {

int64_t layer_norm_block_params(const ModelConfig& c) {
  const int64_t d = c.d_model, f = c.d_ff;
  return 2 * 2 * d                     // two LayerNorms
         + 4 * (d * d + d)             // q, k, v, o with biases
         + (d * f + f) + (f * d + d);  // MLP with biases
}

double block_flops(const ModelConfig& c, int64_t T, double proj, double mlp) {
  const double attn_dim = static_cast<double>(c.n_head * c.head_dim());
  // A sliding window (Mistral) bounds the keys each query scores.
  const int64_t keys = c.sliding_window > 0 ? std::min(T, c.sliding_window) : T;
  return 2 * (proj + mlp) + 2 * 2 * static_cast<double>(keys) * attn_dim;
}

double layer_norm_block_flops(const ModelConfig& c, int64_t T) {
  const double d = c.d_model, f = c.d_ff;
  return block_flops(c, T, 4 * d * d, 2 * d * f);
}

int64_t mlp_block_bwd(const ActivationSizes& s) {
  // The incoming gradient, the MLP's d_ff-wide input gradient from its second linear and that
  // linear's weight gradient, before the saved tensors it frees.
  return s.Ns * s.C * s.e + s.N * s.Fl * s.e + s.C * s.Fl * s.e;
}

int64_t final_norm_head(const ActivationSizes& s) {
  return s.Ns * s.C * s.e + s.N * s.C * s.e + 2 * s.Ns * s.e;
}

TpParamSplit layer_norm_tp_split(const ModelConfig& c, int tp) {
  const int64_t d = c.d_model;
  TpParamSplit s;
  s.replicated = 2 * 2 * d + 2 * d;  // two LayerNorms, attention-out and MLP-out biases
  s.largest_block = d * std::max(c.d_ff, 3 * d) / tp;
  return s;
}

TpParamSplit encoder_tp_split(const ModelConfig& c, int tp, int64_t Vp, int64_t outside) {
  TpParamSplit s = layer_norm_tp_split(c, tp);
  s.tied = Vp * c.d_model / tp;
  s.embed = outside - c.vocab_size * c.d_model;
  return s;
}

FamilyActivations layer_norm_activations(const ActivationSizes& s) {
  FamilyActivations a;
  // GPT-2: ln_1's input, the input c_attn saves (ln_1's output; gathered under split_gather),
  // h1 (ln_2's input), c_fc's input; c_fc's output (gelu's input) and gelu's output (c_proj's
  // input). BERT (post-LN) saves the same count: the block input q/k/v read, two LayerNorm
  // inputs, the intermediate's input and the two d_ff tensors.
  a.block = (2 * s.Ns + 2 * s.N) * s.C * s.e + s.attn + 2 * s.N * s.Fl * s.e + 2 * 2 * s.Ns * s.e;
  a.block_bwd = mlp_block_bwd(s);
  a.head = final_norm_head(s);
  return a;
}

FamilyCost layer_norm_cost() {
  FamilyCost k;
  k.block_params = [](const ModelConfig& c, bool) { return layer_norm_block_params(c); };
  k.block_flops = layer_norm_block_flops;
  k.default_seq_len = [](const ModelConfig& c) { return c.max_seq; };
  k.activations = [](const ModelConfig&, const ActivationSizes& s) {
    return layer_norm_activations(s);
  };
  return k;
}

}  // namespace cost
}  // namespace mammoth::models
