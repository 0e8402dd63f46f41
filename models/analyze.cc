#include "models/analyze.h"

#include <algorithm>

#include "base/error.h"

namespace mammoth::models {
namespace {

// Parameters of one transformer block.
int64_t block_params(const ModelConfig& c) {
  const int64_t d = c.d_model, f = c.d_ff;
  switch (c.family) {
    case Family::kLlama: {
      const int64_t kv = c.n_kv_head * c.head_dim();
      return 2 * d                         // two RMSNorm weights
             + d * d + 2 * d * kv + d * d  // q, k, v, o (no biases)
             + 3 * d * f;                  // gate, up, down
    }
    case Family::kGpt2:
    case Family::kBert:
    case Family::kVit:
      return 2 * 2 * d                     // two LayerNorms
             + 4 * (d * d + d)             // q, k, v, o with biases
             + (d * f + f) + (f * d + d);  // MLP with biases
  }
  return 0;
}

// Matmul FLOPs per token of one block, forward.
double block_flops(const ModelConfig& c, int64_t T) {
  const double d = c.d_model, f = c.d_ff;
  const double kv = static_cast<double>(c.n_kv_head * c.head_dim());
  const double attn_dim = static_cast<double>(c.n_head * c.head_dim());
  const double proj =
      c.family == Family::kLlama ? d * attn_dim + 2 * d * kv + attn_dim * d : 4 * d * d;
  const double mlp = c.family == Family::kLlama ? 3 * d * f : 2 * d * f;
  return 2 * (proj + mlp) + 2 * 2 * static_cast<double>(T) * attn_dim;
}

}  // namespace

int64_t count_parameters(const ModelConfig& c) {
  const int64_t d = c.d_model, V = c.vocab_size;
  int64_t n = c.n_layer * block_params(c);
  switch (c.family) {
    case Family::kGpt2:
      n += V * d + c.max_seq * d + 2 * d + (c.tie_embeddings ? 0 : V * d);  // wte, wpe, ln_f, head
      break;
    case Family::kLlama:
      n += V * d + d + (c.tie_embeddings ? 0 : V * d);  // embed, norm, lm_head
      break;
    case Family::kBert:
      n += (V + c.max_seq + c.type_vocab_size) * d + 2 * d;  // embeddings + LayerNorm
      n += d * d + d;                                        // pooler
      n += d * d + d + 2 * d + V;                            // MLM transform + decoder bias
      if (c.num_labels > 0) n += c.num_labels * d + c.num_labels;
      break;
    case Family::kVit:
      n += d + (c.num_patches() + 1) * d;                         // cls, positions
      n += d * c.num_channels * c.patch_size * c.patch_size + d;  // patch projection
      n += 2 * d + c.num_labels * d + c.num_labels;               // layernorm, classifier
      break;
  }
  return n;
}

ModelAnalysis analyze(const ModelConfig& c, int64_t seq_len) {
  ModelAnalysis a;
  a.config = c;
  a.params = count_parameters(c);
  const int64_t d = c.d_model, V = c.vocab_size;
  a.seq_len = seq_len > 0 ? seq_len : (c.family == Family::kVit ? c.num_patches() + 1 : c.max_seq);
  const int64_t T = a.seq_len;
  double head = 0;
  switch (c.family) {
    case Family::kGpt2:
      a.embedding_params = (V + c.max_seq) * d;
      head = 2.0 * d * V;
      break;
    case Family::kLlama:
      a.embedding_params = V * d;
      head = 2.0 * d * V;
      break;
    case Family::kBert:
      a.embedding_params = (V + c.max_seq + c.type_vocab_size) * d;
      head = 2.0 * d * d + 2.0 * d * V;  // MLM transform + decoder on every token
      break;
    case Family::kVit:
      // Patch projection on every patch token; the classifier once per image, amortised.
      a.embedding_params = (c.num_patches() + 1) * d;
      head = 2.0 * d * c.num_channels * c.patch_size * c.patch_size *
                 (static_cast<double>(c.num_patches()) / T) +
             2.0 * d * c.num_labels / T;
      break;
  }
  a.block_flops_per_token_forward = block_flops(c, T);
  a.head_flops_per_token_forward = head;
  a.flops_per_token_forward = c.n_layer * block_flops(c, T) + head;
  a.flops_per_token_train = 3 * a.flops_per_token_forward;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    MemoryEstimate m;
    m.dtype = dt;
    m.weights_bytes = a.params * static_cast<int64_t>(dtype_size(dt));
    m.grads_bytes = m.weights_bytes;
    m.optimizer_bytes = a.params * (dt == DType::kF32 ? 8 : 12);
    a.memory.push_back(m);
  }
  return a;
}

json::Value analysis_to_json(const ModelAnalysis& a) {
  json::Value v = json::Value::object();
  v.set("model", a.config.name).set("family", family_name(a.config.family));
  v.set("params", a.params).set("embedding_params", a.embedding_params);
  v.set("seq_len", a.seq_len);
  v.set("flops_per_token_forward", a.flops_per_token_forward);
  v.set("flops_per_token_train", a.flops_per_token_train);
  json::Value mem = json::Value::object();
  for (const MemoryEstimate& m : a.memory) {
    mem.set(dtype_name(m.dtype), json::Value::object()
                                     .set("weights_bytes", m.weights_bytes)
                                     .set("grads_bytes", m.grads_bytes)
                                     .set("optimizer_bytes", m.optimizer_bytes)
                                     .set("total_bytes", m.total_bytes()));
  }
  v.set("memory", std::move(mem));
  return v;
}

namespace {

struct Need {
  int64_t device = 0, host = 0, nvme = 0;
};

// Bytes per tier for `setting` (see OffloadFit).
Need need_for(const std::string& setting, const ModelConfig& c, int64_t chunk_bytes, int dp) {
  const int64_t params = count_parameters(c);
  const int64_t elem = static_cast<int64_t>(dtype_size(c.dtype));
  const int64_t w = params * elem, g = w;
  const int64_t o_all = params * (c.dtype == DType::kF32 ? 8 : 12);
  // A chunk holds at least the largest parameter (a parameter never straddles chunks).
  const int64_t largest =
      std::max({c.vocab_size * c.d_model, c.d_model * std::max(c.d_ff, 3 * c.d_model)}) * elem;
  const int64_t chunk = std::max(chunk_bytes, largest);
  // Under dp each rank keeps the states of the chunks it owns (chunk k on rank k % dp): an even
  // share, up to one chunk more of each of the two moment lists.
  const int64_t o = dp > 1 ? std::min(o_all, (o_all + dp - 1) / dp + 2 * chunk) : o_all;
  Need n;
  if (dp > 1) n.host += 4 * chunk;  // gradient chunks being averaged
  if (setting == "none") {
    n.device = w + g + o;
  } else if (setting == "host") {
    n.device = w + g;
    n.host += o;
  } else if (setting == "nvme") {
    n.device = w + g;
    n.host += 2 * chunk;
    n.nvme = o;
  } else if (setting == "host-paged") {
    n.device = std::min(w + g + o, 4 * chunk);
    n.host += w + g + o;
  } else {
    n.device = std::min(w + g, 2 * chunk);
    n.host += w + g + 2 * chunk;
    n.nvme = o;
  }
  return n;
}

bool fits(const Need& n, int64_t device_mem, int64_t host_mem) {
  return (device_mem == 0 || n.device <= device_mem) && (host_mem == 0 || n.host <= host_mem);
}

}  // namespace

std::vector<OffloadFit> offload_fits(const ModelConfig& config, int64_t device_mem,
                                     int64_t host_mem, int64_t chunk_bytes, int dp) {
  MAMMOTH_CHECK(dp >= 1) << "[analyze] --dp must be >= 1, got " << dp;
  std::vector<OffloadFit> out;
  for (const char* setting : {"none", "host", "nvme", "host-paged", "nvme-paged"}) {
    OffloadFit f;
    f.setting = setting;
    const Need n = need_for(setting, config, chunk_bytes, dp);
    f.device_bytes = n.device;
    f.host_bytes = n.host;
    f.nvme_bytes = n.nvme;
    f.fits = fits(n, device_mem, host_mem);
    // Memory grows with depth: double, then bisect, the deepest fitting n_layer (capped, as
    // unlimited budgets fit any depth).
    constexpr int64_t kCap = 1 << 20;
    auto ok = [&](int64_t layers) {
      ModelConfig c = config;
      c.n_layer = layers;
      return fits(need_for(setting, c, chunk_bytes, dp), device_mem, host_mem);
    };
    int64_t lo = 0, hi = 1;
    while (hi <= kCap && ok(hi)) {
      lo = hi;
      hi *= 2;
    }
    if (hi > kCap) {
      lo = kCap;
    } else {
      while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (ok(mid) ? lo : hi) = mid;
      }
    }
    f.max_layers = lo;
    if (lo > 0) {
      ModelConfig c = config;
      c.n_layer = lo;
      f.max_params = count_parameters(c);
    }
    out.push_back(f);
  }
  return out;
}

json::Value offload_fits_to_json(const std::vector<OffloadFit>& fits, int64_t device_mem,
                                 int64_t host_mem) {
  json::Value rows = json::Value::array();
  for (const OffloadFit& f : fits) {
    rows.push_back(json::Value::object()
                       .set("setting", f.setting)
                       .set("device_bytes", f.device_bytes)
                       .set("host_bytes", f.host_bytes)
                       .set("nvme_bytes", f.nvme_bytes)
                       .set("fits", f.fits)
                       .set("max_layers", f.max_layers)
                       .set("max_params", f.max_params));
  }
  return json::Value::object()
      .set("device_mem", device_mem)
      .set("host_mem", host_mem)
      .set("settings", std::move(rows));
}

}  // namespace mammoth::models
