#include "models/analyze.h"

#include "models/family.h"

namespace mammoth::models {

int64_t count_parameters(const ModelConfig& c) {
  const FamilyCost& cost = family_spec(c.family).cost;
  return c.n_layer * cost.block_params(c, false) + cost.outside_params(c);
}

ModelAnalysis analyze(const ModelConfig& c, int64_t seq_len) {
  const FamilyCost& cost = family_spec(c.family).cost;
  ModelAnalysis a;
  a.config = c;
  a.params = count_parameters(c);
  a.active_params =
      a.params - c.n_layer * (cost.block_params(c, false) - cost.block_params(c, true));
  a.seq_len = seq_len > 0 ? seq_len : cost.default_seq_len(c);
  const int64_t T = a.seq_len;
  a.embedding_params = cost.embedding_params(c);
  const double block = cost.block_flops(c, T);
  a.block_flops_per_token_forward = block;
  a.head_flops_per_token_forward = cost.head_flops(c, T);
  a.flops_per_token_forward = c.n_layer * block + a.head_flops_per_token_forward;
  a.flops_per_token_train = 3 * a.flops_per_token_forward;
  return a;
}

json::Value analysis_to_json(const ModelAnalysis& a) {
  json::Value v = json::Value::object();
  v.set("model", a.config.name).set("family", family_name(a.config.family));
  v.set("params", a.params).set("active_params", a.active_params);
  v.set("embedding_params", a.embedding_params);
  v.set("seq_len", a.seq_len);
  v.set("flops_per_token_forward", a.flops_per_token_forward);
  v.set("flops_per_token_train", a.flops_per_token_train);
  return v;
}

}  // namespace mammoth::models
