// Helper for safetensors_interop_test.py: the C++ side of the round trip with the PyPI package.
//
//   safetensors_tool write DIR   writes DIR/mammoth.safetensors: for every dtype a (2, 3, 4)
//                                tensor, a scalar and an empty (0, 2) tensor, with the contents
//                                defined by expected_element() below (the Python test computes
//                                the same formula independently), plus metadata.
//   safetensors_tool check FILE  reads FILE with Mammoth's reader and prints it as JSON:
//                                {"metadata": {...}, "tensors": [{"name", "dtype", "shape",
//                                "hex"}]} in file order, for the Python test to compare.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "base/json.h"
#include "engine/io/safetensors.h"

namespace mammoth {
namespace {

// Element i of a tensor with `count` elements, as a double (integers are exact in range).
// Keep in sync with expected_values() in safetensors_interop_test.py.
double float_value(int64_t i, int64_t count, DType dtype) {
  if (count >= 4) {
    if (i == 0) return std::numeric_limits<double>::infinity();
    if (i == 1) return -std::numeric_limits<double>::infinity();
    if (i == 2) return -0.0;
    if (i == 3 && (dtype == DType::kF32 || dtype == DType::kF64)) return 0.1;
  }
  return static_cast<double>((i * 37) % 101 - 50) / 8.0;
}

int64_t int_value(int64_t i, int64_t count, DType dtype) {
  const int64_t k = (i * 37) % 101 - 50;
  if (dtype == DType::kI32) {
    if (count >= 4 && i == 0) return std::numeric_limits<int32_t>::min();
    if (count >= 4 && i == 1) return std::numeric_limits<int32_t>::max();
    return k * 40'000'000;
  }
  if (dtype == DType::kI64) {
    if (count >= 4 && i == 0) return std::numeric_limits<int64_t>::min();
    if (count >= 4 && i == 1) return std::numeric_limits<int64_t>::max();
    return k * 180'000'000'000'000'000;
  }
  if (dtype == DType::kU8) return (i * 37) % 256;
  return i % 3 == 0 ? 1 : 0;  // bool
}

template <typename T>
void append(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}

std::vector<uint8_t> expected_bytes(DType dtype, int64_t count) {
  std::vector<uint8_t> out;
  for (int64_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::kF32:
        append(out, static_cast<float>(float_value(i, count, dtype)));
        break;
      case DType::kF64:
        append(out, float_value(i, count, dtype));
        break;
      case DType::kBF16:
        append(out, float_to_bf16(static_cast<float>(float_value(i, count, dtype))).bits);
        break;
      case DType::kF16:
        append(out, float_to_f16(static_cast<float>(float_value(i, count, dtype))).bits);
        break;
      case DType::kI32:
        append(out, static_cast<int32_t>(int_value(i, count, dtype)));
        break;
      case DType::kI64:
        append(out, int_value(i, count, dtype));
        break;
      case DType::kU8:
      case DType::kBool:
        append(out, static_cast<uint8_t>(int_value(i, count, dtype)));
        break;
    }
  }
  return out;
}

int write_files(const std::string& dir) {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<io::TensorView> views;
  storage.reserve(3 * std::size(kAllDTypes));
  for (DType dtype : kAllDTypes) {
    const std::string prefix = std::string(dtype_name(dtype)) + ".";
    for (const auto& [suffix, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"main", {2, 3, 4}}, {"scalar", {}}, {"empty", {0, 2}}}) {
      int64_t count = 1;
      for (int64_t d : shape) count *= d;
      storage.push_back(expected_bytes(dtype, count));
      views.push_back(
          {prefix + suffix, dtype, shape, storage.back().data(), storage.back().size()});
    }
  }
  io::write_safetensors(dir + "/mammoth.safetensors", views,
                        {{"producer", "mammoth"}, {"unicode", "\xc3\xa9\xe2\x82\xac"}});
  return 0;
}

int check_file(const std::string& path) {
  io::SafetensorsFile f = io::SafetensorsFile::open(path);
  json::Value metadata = json::Value::object();
  for (const auto& [k, v] : f.metadata()) metadata.set(k, v);
  json::Value tensors = json::Value::array();
  for (const io::TensorView& t : f.tensors()) {
    json::Value shape = json::Value::array();
    for (int64_t d : t.shape) shape.push_back(d);
    std::string hex;
    hex.reserve(2 * t.nbytes);
    for (size_t i = 0; i < t.nbytes; ++i) {
      char buf[3];
      std::snprintf(buf, sizeof(buf), "%02x", t.data[i]);
      hex += buf;
    }
    tensors.push_back(json::Value::object()
                          .set("name", t.name)
                          .set("dtype", dtype_safetensors_name(t.dtype))
                          .set("shape", std::move(shape))
                          .set("hex", std::move(hex)));
  }
  json::Value out = json::Value::object();
  out.set("metadata", std::move(metadata)).set("tensors", std::move(tensors));
  std::cout << json::dump(out, 1) << "\n";
  return 0;
}

}  // namespace
}  // namespace mammoth

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: safetensors_tool write DIR | check FILE\n";
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "write") return mammoth::write_files(argv[2]);
    if (cmd == "check") return mammoth::check_file(argv[2]);
  } catch (const mammoth::Error& e) {
    std::cerr << "safetensors_tool: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "safetensors_tool: unknown command " << cmd << "\n";
  return 2;
}
