#include "models/llama/rope.h"

#include <cmath>
#include <numbers>

#include "base/error.h"
#include "engine/ops.h"

namespace mammoth::models {

using RopeScaling = ModelConfig::RopeScaling;

double rope_base_at(const ModelConfig& c, int64_t seq_len) {
  if (c.rope_scaling != RopeScaling::kDynamic || seq_len <= c.max_seq) return c.rope_base;
  const double dim = static_cast<double>(c.head_dim());
  const double growth =
      c.rope_factor * static_cast<double>(seq_len) / static_cast<double>(c.max_seq) -
      (c.rope_factor - 1);
  return c.rope_base * std::pow(growth, dim / (dim - 2));
}

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  if (c.rope_scaling != RopeScaling::kLinear && c.rope_scaling != RopeScaling::kLlama3) return {};
  const int64_t dim = c.head_dim(), half = dim / 2;
  std::vector<float> out(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    // The default frequency, rounded to float as engine::rope and transformers hold it.
    const double inv = static_cast<float>(
        1.0 / std::pow(c.rope_base, static_cast<double>(2 * i) / static_cast<double>(dim)));
    double scaled = inv / c.rope_factor;
    if (c.rope_scaling == RopeScaling::kLlama3) {
      // Wavelengths longer than the old context / low_freq_factor are slowed by `factor`,
      // shorter than old context / high_freq_factor kept, and the band between blended.
      const double old_context = static_cast<double>(c.rope_original_max_seq);
      const double wavelen = 2 * std::numbers::pi / inv;
      const double low_wavelen = old_context / c.rope_low_freq_factor;
      const double high_wavelen = old_context / c.rope_high_freq_factor;
      if (wavelen < high_wavelen) {
        scaled = inv;
      } else if (wavelen <= low_wavelen) {
        const double smooth = (old_context / wavelen - c.rope_low_freq_factor) /
                              (c.rope_high_freq_factor - c.rope_low_freq_factor);
        scaled = (1 - smooth) * inv / c.rope_factor + smooth * inv;
      }
    }
    out[static_cast<size_t>(i)] = static_cast<float>(scaled);
  }
  return out;
}

engine::Tensor llama_rope(const engine::Tensor& t, const ModelConfig& c, int64_t offset,
                          int64_t seq_len) {
  const std::vector<float> table = rope_inv_freq(c);
  if (table.empty()) return engine::rope(t, rope_base_at(c, seq_len), offset);
  // A few dozen floats per call; copied to t's device (a host-to-device copy under CUDA).
  const std::vector<double> values(table.begin(), table.end());
  const engine::Tensor inv_freq =
      engine::Tensor::from_vector(values, {static_cast<int64_t>(values.size())}).to(t.device());
  return engine::rope(t, c.rope_base, offset, 0, inv_freq);
}

engine::Tensor llama_rope_at(const engine::Tensor& t, const std::vector<int64_t>& positions,
                             const ModelConfig& c) {
  const int64_t n = static_cast<int64_t>(positions.size());
  MAMMOTH_CHECK(t.size(1) == n) << "[llama_rope_at] " << t.size(1) << " rows but " << n
                                << " positions";
  std::vector<engine::Tensor> runs;
  int64_t start = 0;
  for (int64_t i = 1; i <= n; ++i) {
    if (i < n && positions[i] == positions[i - 1] + 1) continue;
    const engine::Tensor part = start == 0 && i == n ? t : t.slice(1, start, i);
    runs.push_back(llama_rope(part, c, positions[start], 0));
    start = i;
  }
  return runs.size() == 1 ? runs[0] : engine::concat(runs, 1);
}

}  // namespace mammoth::models
