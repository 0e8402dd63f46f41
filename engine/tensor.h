// Tensor: a strided view of typed storage on a device, and a node of the autograd graph.
//
// A Tensor is a cheap handle (shared_ptr) to a TensorImpl: storage + element offset + shape +
// strides (in elements) + dtype. Views (reshape, permute, slice, expand, ...) share storage.
// Storage always comes from a memory::Allocator. Every op is a free function in engine/ops.h;
// the methods here are the view/creation basics plus autograd state.
//
//   Tensor x = Tensor::randn({4, 8}, /*seed=*/1).requires_grad_();
//   Tensor y = sum(gelu(matmul(x, w)));
//   y.backward();            // x.grad() now holds dy/dx
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "base/device.h"
#include "base/dtype.h"
#include "base/error.h"
#include "kernels/kernel.h"

namespace mammoth::memory {
class Allocator;
}

namespace mammoth::engine {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
std::string shape_str(const Shape& shape);  // "(2, 3)"

// Bytes on a device. Freed through its allocator, or by `release` for external memory
// (e.g. a memory-mapped safetensors file).
struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  memory::Allocator* allocator = nullptr;
  std::function<void()> release;
  // Residency hook for paged memory (memory/chunks via engine/offload): when set, every kernel
  // launch (detail::launch_for) calls it before reading `data`, with write = true for outputs,
  // so the owner can bring the bytes onto the compute device and update `data`. Empty (the
  // default) costs one branch per argument.
  std::function<void(bool write)> ensure_resident;

  Storage(size_t nbytes, Device device);  // allocates
  Storage(void* data, size_t nbytes, Device device, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

class Node;
struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;  // undefined
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- creation ----
  static Tensor empty(const Shape& shape, DType dtype = DType::kF32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::kF32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::kF32,
                     Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = DType::kF32);
  // Copies `values` (converted to dtype) into a new CPU tensor of `shape`.
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                            DType dtype = DType::kF32);
  static Tensor from_ints(const std::vector<int64_t>& values, const Shape& shape,
                          DType dtype = DType::kI64);
  static Tensor arange(int64_t n, DType dtype = DType::kI64);
  // Normal(mean, std) / Uniform[low, high) from Philox(seed) stream `stream`: deterministic.
  static Tensor randn(const Shape& shape, uint64_t seed, double mean = 0.0, double stddev = 1.0,
                      DType dtype = DType::kF32, uint64_t stream = 0);
  static Tensor rand(const Shape& shape, uint64_t seed, double low = 0.0, double high = 1.0,
                     DType dtype = DType::kF32, uint64_t stream = 0);
  // Wraps external memory without copying; `release` runs when the last view dies.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device,
                          std::function<void()> release);

  // ---- properties ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t offset() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const { return shape_numel(shape()); }
  DType dtype() const;
  Device device() const;
  bool is_contiguous() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  const std::shared_ptr<Storage>& storage() const;
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // Raw pointer to element 0 of this view (CPU or device memory).
  void* raw_data() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw_data());
  }
  // Copies the elements (in logical order) to host as double / int64.
  std::vector<double> to_vector() const;
  std::vector<int64_t> to_int_vector() const;
  double item() const;  // a one-element tensor's value

  // ---- views (differentiable) ----
  Tensor view(const Shape& shape) const;     // needs compatible strides; -1 infers one dim
  Tensor reshape(const Shape& shape) const;  // view when possible, else copies
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // slice + squeeze
  Tensor expand(const Shape& shape) const;          // broadcast, stride 0
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor contiguous() const;
  Tensor to(DType dtype) const;  // cast (differentiable between float types)
  // A copy on `device` (this tensor itself when already there). Not differentiable: move
  // parameters and data before building a graph.
  Tensor to(Device device) const;
  Tensor clone() const;
  Tensor detach() const;  // same storage, no autograd history
  // Low level, not differentiable: a view with explicit shape, strides and element offset.
  Tensor as_strided(const Shape& shape, const Shape& strides, int64_t offset) const;

  // ---- autograd ----
  bool requires_grad() const;
  Tensor& requires_grad_(bool value = true);
  bool is_leaf() const;
  Tensor grad() const;
  void set_grad(const Tensor& g) const;
  void zero_grad() const;  // drops the gradient
  const std::shared_ptr<Node>& grad_fn() const;
  // Reverse-mode backward from this tensor. A non-scalar root needs an explicit gradient.
  void backward(const Tensor& gradient = Tensor()) const;

  // Low-level: this view as a kernel argument.
  kernels::TensorArg arg() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Shape strides;  // in elements
  DType dtype = DType::kF32;
  // autograd
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  int output_nr = 0;
  // Leaves only: called once per backward, after the last contribution to .grad (see
  // set_grad_ready_hook in engine/autograd.h).
  std::function<void()> grad_ready_hook;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Normalises a possibly negative dim against ndim; throws naming `op` when out of range.
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);

// Checks that a tensor is defined, naming the op and argument.
void check_defined(const Tensor& t, const char* op, const char* arg);

}  // namespace mammoth::engine
