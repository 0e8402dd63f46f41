#include "engine/io/tensor_io.h"

#include <set>
#include <sstream>

#include "engine/ops.h"

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

void load_tensors(const engine::nn::NamedTensors& dst, const SafetensorsFile& file) {
  std::ostringstream problems;
  int count = 0;
  std::set<std::string> expected;
  for (const auto& [name, t] : dst) {
    expected.insert(name);
    const TensorView* v = file.find(name);
    if (v == nullptr) {
      problems << "\n  missing: " << name;
      ++count;
    } else if (v->shape != t.shape() || v->dtype != t.dtype()) {
      problems << "\n  " << name << ": file has " << engine::shape_str(v->shape) << " "
               << dtype_name(v->dtype) << ", expected " << engine::shape_str(t.shape()) << " "
               << dtype_name(t.dtype());
      ++count;
    }
  }
  for (const std::string& name : file.names()) {
    if (!expected.count(name)) {
      problems << "\n  unexpected: " << name;
      ++count;
    }
  }
  MAMMOTH_CHECK(count == 0) << "[load_tensors] " << file.path() << ": " << count
                            << " problem(s):" << problems.str();
  for (const auto& [name, t] : dst) {
    const TensorView& v = file.get(name);
    engine::Tensor src = engine::Tensor::from_blob(const_cast<uint8_t*>(v.data), v.shape, v.dtype,
                                                   Device::cpu(), nullptr);
    engine::copy_(t, src);
  }
}

}  // namespace mammoth::io
