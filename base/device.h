// Where a tensor's bytes live: the CPU, or one CUDA device.
#pragma once

#include <ostream>
#include <string>

namespace mammoth {

enum class DeviceType : unsigned char { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int i) { return {DeviceType::kCUDA, i}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const {
    return type == DeviceType::kCPU ? "cpu" : "cuda:" + std::to_string(index);
  }
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

}  // namespace mammoth
