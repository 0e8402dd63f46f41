#include "engine/io/tensor_io.h"

#include "base/error.h"

namespace mammoth::io {

std::vector<TensorView> views_of(const engine::nn::NamedTensors& tensors) {
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    MAMMOTH_CHECK(t.is_contiguous() && t.device().is_cpu())
        << "[save_tensors] tensor '" << name << "' must be a contiguous CPU tensor";
    views.push_back(
        {name, t.dtype(), t.shape(), static_cast<const uint8_t*>(t.raw_data()), t.nbytes()});
  }
  return views;
}

void save_tensors(const std::string& path, const engine::nn::NamedTensors& tensors,
                  const std::map<std::string, std::string>& metadata) {
  write_safetensors(path, views_of(tensors), metadata);
}

}  // namespace mammoth::io
