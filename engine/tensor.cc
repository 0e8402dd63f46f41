#include "engine/tensor.h"

#include <cmath>
#include <numeric>
#include <sstream>

#include "base/philox.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/params.h"
#include "kernels/registry.h"
#include "memory/allocator.h"
#ifdef MAMMOTH_WITH_CUDA
#include "memory/cuda/device.h"
#endif

namespace mammoth::engine {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) os << ",";
  os << ")";
  return os.str();
}

int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t d = dim < 0 ? dim + ndim : dim;
  MAMMOTH_CHECK(d >= 0 && d < ndim)
      << "[" << op << "] dim " << dim << " is out of range for a tensor with " << ndim << " dims";
  return d;
}

void check_defined(const Tensor& t, const char* op, const char* arg) {
  MAMMOTH_CHECK(t.defined()) << "[" << op << "] argument '" << arg << "' is an undefined tensor";
}

Storage::Storage(size_t n, Device d) : nbytes(n), device(d) {
  allocator = &memory::allocator_for(d);
  data = allocator->allocate(n);
}

Storage::Storage(void* p, size_t n, Device d, std::function<void()> r)
    : data(p), nbytes(n), device(d), release(std::move(r)) {}

Storage::~Storage() {
  if (allocator != nullptr) {
    allocator->deallocate(data, nbytes);
  } else if (release) {
    release();
  }
}

namespace {

std::shared_ptr<TensorImpl> make_impl(std::shared_ptr<Storage> storage, int64_t offset, Shape shape,
                                      Shape strides, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->offset = offset;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = dtype;
  return impl;
}

void check_shape(const Shape& shape, const char* op) {
  MAMMOTH_CHECK(shape.size() <= static_cast<size_t>(kernels::kMaxDims))
      << "[" << op << "] at most " << kernels::kMaxDims << " dims are supported, got "
      << shape_str(shape);
  for (int64_t s : shape) {
    MAMMOTH_CHECK(s >= 0) << "[" << op << "] negative size in shape " << shape_str(shape);
  }
}

// A view sharing storage; records `backward` under op name `name` when needed.
Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset, const char* name,
                 BackwardFn backward) {
  Tensor out(make_impl(base.storage(), offset, std::move(shape), std::move(strides), base.dtype()));
  if (needs_grad({base})) record(name, {base}, {&out}, std::move(backward));
  return out;
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_shape(shape, "empty");
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return Tensor(make_impl(std::make_shared<Storage>(bytes, device), 0, shape,
                          contiguous_strides(shape), dtype));
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  fill_(t, value);
  return t;
}
Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor Tensor::scalar(double value, DType dtype) { return full({}, value, dtype); }

Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype) {
  MAMMOTH_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape))
      << "[from_vector] " << values.size() << " values do not fill shape " << shape_str(shape);
  Tensor src =
      from_blob(const_cast<double*>(values.data()), shape, DType::kF64, Device::cpu(), nullptr);
  Tensor t = empty(shape, dtype);
  copy_(t, src);
  return t;
}

Tensor Tensor::from_ints(const std::vector<int64_t>& values, const Shape& shape, DType dtype) {
  MAMMOTH_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape))
      << "[from_ints] " << values.size() << " values do not fill shape " << shape_str(shape);
  Tensor src =
      from_blob(const_cast<int64_t*>(values.data()), shape, DType::kI64, Device::cpu(), nullptr);
  Tensor t = empty(shape, dtype);
  copy_(t, src);
  return t;
}

Tensor Tensor::arange(int64_t n, DType dtype) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return from_ints(v, {n}, dtype);
}

Tensor Tensor::randn(const Shape& shape, uint64_t seed, double mean, double stddev, DType dtype,
                     uint64_t stream) {
  const int64_t n = shape_numel(shape);
  std::vector<double> v(static_cast<size_t>(n));
  // Box-Muller on pairs of Philox uniforms; element i uses counter (stream << 32) + i / 2.
  for (int64_t i = 0; i < n; i += 2) {
    const PhiloxOut r = philox4x32(static_cast<uint64_t>(i / 2), stream, seed);
    const double u1 = (static_cast<double>(r.v[0]) + 1.0) / 4294967296.0;  // (0, 1]
    const double u2 = static_cast<double>(r.v[1]) / 4294967296.0;
    const double rad = std::sqrt(-2.0 * std::log(u1));
    v[i] = mean + stddev * rad * std::cos(2.0 * M_PI * u2);
    if (i + 1 < n) v[i + 1] = mean + stddev * rad * std::sin(2.0 * M_PI * u2);
  }
  return from_vector(v, shape, dtype);
}

Tensor Tensor::rand(const Shape& shape, uint64_t seed, double low, double high, DType dtype,
                    uint64_t stream) {
  const int64_t n = shape_numel(shape);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const PhiloxOut r = philox4x32(static_cast<uint64_t>(i), stream, seed);
    const double u = (static_cast<double>(r.v[0]) * 4294967296.0 + r.v[1]) / 18446744073709551616.0;
    v[i] = low + (high - low) * u;
  }
  return from_vector(v, shape, dtype);
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device,
                         std::function<void()> release) {
  check_shape(shape, "from_blob");
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>(data, bytes, device, std::move(release));
  return Tensor(make_impl(std::move(storage), 0, shape, contiguous_strides(shape), dtype));
}

namespace {
const TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl) {
  MAMMOTH_CHECK(impl != nullptr) << "[tensor] use of an undefined tensor";
  return *impl;
}
}  // namespace

const Shape& Tensor::shape() const { return checked(impl_).shape; }
const Shape& Tensor::strides() const { return checked(impl_).strides; }
int64_t Tensor::offset() const { return checked(impl_).offset; }
DType Tensor::dtype() const { return checked(impl_).dtype; }
Device Tensor::device() const { return checked(impl_).storage->device; }
const std::shared_ptr<Storage>& Tensor::storage() const { return checked(impl_).storage; }

int64_t Tensor::size(int64_t d) const { return shape()[normalize_dim(d, dim(), "size")]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape()[i] != 1 && strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  return static_cast<char*>(storage()->data) + offset() * static_cast<int64_t>(dtype_size(dtype()));
}

kernels::TensorArg Tensor::arg() const {
  kernels::TensorArg a;
  a.data = raw_data();
  a.dtype = dtype();
  a.ndim = static_cast<int>(dim());
  for (int i = 0; i < a.ndim; ++i) {
    a.shape[i] = shape()[i];
    a.strides[i] = strides()[i];
  }
  return a;
}

std::vector<double> Tensor::to_vector() const {
  std::vector<double> v(static_cast<size_t>(numel()));
  Tensor dst = from_blob(v.data(), shape(), DType::kF64, Device::cpu(), nullptr);
  copy_(dst, to(Device::cpu()));
  return v;
}

std::vector<int64_t> Tensor::to_int_vector() const {
  std::vector<int64_t> v(static_cast<size_t>(numel()));
  Tensor dst = from_blob(v.data(), shape(), DType::kI64, Device::cpu(), nullptr);
  copy_(dst, to(Device::cpu()));
  return v;
}

double Tensor::item() const {
  MAMMOTH_CHECK(numel() == 1) << "[item] needs a one-element tensor, got shape "
                              << shape_str(shape());
  return to_vector()[0];
}

// ---- views ----

namespace {
// Infers a -1 entry and checks the element count.
Shape infer_shape(const Shape& shape, int64_t numel, const Shape& from) {
  Shape out = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      MAMMOTH_CHECK(infer < 0) << "[view] only one dim may be -1 in " << shape_str(shape);
      infer = static_cast<int64_t>(i);
    } else {
      MAMMOTH_CHECK(out[i] >= 0) << "[view] invalid size in " << shape_str(shape);
      known *= out[i];
    }
  }
  if (infer >= 0) {
    MAMMOTH_CHECK(known > 0 && numel % known == 0)
        << "[view] cannot view shape " << shape_str(from) << " as " << shape_str(shape);
    out[infer] = numel / known;
  }
  MAMMOTH_CHECK(shape_numel(out) == numel)
      << "[view] shape " << shape_str(shape) << " has " << shape_numel(out)
      << " elements but the tensor of shape " << shape_str(from) << " has " << numel;
  return out;
}

// Strides for viewing (shape, strides) as new_shape without copying, if possible: old dims
// are grouped into runs that are contiguous among themselves, and each run must be covered
// exactly by consecutive new dims.
bool view_strides(const Shape& shape, const Shape& strides, const Shape& new_shape, Shape* out) {
  Shape result(new_shape.size(), 1);
  if (shape.empty() || shape_numel(shape) == 0) {
    *out = contiguous_strides(new_shape);
    return true;
  }
  int64_t vd = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t run_stride = strides.back();
  int64_t run_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    run_numel *= shape[d];
    const bool run_ends = d == 0 || (shape[d - 1] != 1 && strides[d - 1] != run_numel * run_stride);
    if (!run_ends) continue;
    while (vd >= 0 && (view_numel < run_numel || new_shape[vd] == 1)) {
      result[vd] = view_numel * run_stride;
      view_numel *= new_shape[vd];
      --vd;
    }
    if (view_numel != run_numel) return false;
    if (d > 0) {
      run_stride = strides[d - 1];
      run_numel = 1;
      view_numel = 1;
    }
  }
  if (vd != -1) return false;
  *out = result;
  return true;
}
}  // namespace

Tensor Tensor::view(const Shape& new_shape_in) const {
  const Shape new_shape = infer_shape(new_shape_in, numel(), shape());
  check_shape(new_shape, "view");
  Shape strides_out;
  if (is_contiguous()) {
    strides_out = contiguous_strides(new_shape);
  } else {
    MAMMOTH_CHECK(view_strides(shape(), strides(), new_shape, &strides_out))
        << "[view] cannot view a non-contiguous tensor of shape " << shape_str(shape()) << " as "
        << shape_str(new_shape) << " without copying; use reshape()";
  }
  const Shape in_shape = shape();
  return make_view(*this, new_shape, strides_out, offset(), "view",
                   [in_shape](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                     return {g[0].reshape(in_shape)};
                   });
}

Tensor Tensor::reshape(const Shape& new_shape_in) const {
  const Shape new_shape = infer_shape(new_shape_in, numel(), shape());
  Shape unused;
  if (is_contiguous() || view_strides(shape(), strides(), new_shape, &unused)) {
    return view(new_shape);
  }
  return contiguous().view(new_shape);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  MAMMOTH_CHECK(static_cast<int64_t>(dims.size()) == dim())
      << "[permute] got " << dims.size() << " dims for a tensor of shape " << shape_str(shape());
  Shape s(dims.size()), st(dims.size());
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = normalize_dim(dims[i], dim(), "permute");
    MAMMOTH_CHECK(inverse[d] < 0) << "[permute] dim " << d << " repeated";
    inverse[d] = static_cast<int64_t>(i);
    s[i] = shape()[d];
    st[i] = strides()[d];
  }
  return make_view(*this, s, st, offset(), "permute",
                   [inverse](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                     return {g[0].permute(inverse)};
                   });
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  std::vector<int64_t> dims(static_cast<size_t>(dim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[normalize_dim(d0, dim(), "transpose")],
            dims[normalize_dim(d1, dim(), "transpose")]);
  return permute(dims);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = normalize_dim(d, dim(), "slice");
  const int64_t n = shape()[d];
  MAMMOTH_CHECK(step > 0) << "[slice] step must be positive, got " << step;
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = shape(), st = strides();
  s[d] = (end - start + step - 1) / step;
  st[d] = strides()[d] * step;
  const Shape in_shape = shape();
  const DType dt = dtype();
  const Device dev = device();
  return make_view(*this, s, st, offset() + start * strides()[d], "slice",
                   [in_shape, dt, dev, d, start, end,
                    step](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                     Tensor gi = Tensor::zeros(in_shape, dt, dev);
                     copy_(gi.slice(d, start, end, step), g[0]);
                     return {gi};
                   });
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = normalize_dim(d, dim(), "select");
  const int64_t n = shape()[d];
  MAMMOTH_CHECK(index >= -n && index < n)
      << "[select] index " << index << " out of range for dim " << d << " of size " << n;
  if (index < 0) index += n;
  return slice(d, index, index + 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& target) const {
  MAMMOTH_CHECK(static_cast<int64_t>(target.size()) >= dim())
      << "[expand] cannot expand shape " << shape_str(shape()) << " to " << shape_str(target);
  const size_t lead = target.size() - shape().size();
  Shape st(target.size(), 0);
  Shape out = target;
  for (size_t i = 0; i < target.size(); ++i) {
    if (i < lead) {
      MAMMOTH_CHECK(target[i] >= 0) << "[expand] bad target " << shape_str(target);
      continue;
    }
    const int64_t s = shape()[i - lead];
    if (target[i] == -1 || target[i] == s) {
      out[i] = s;
      st[i] = strides()[i - lead];
    } else {
      MAMMOTH_CHECK(s == 1) << "[expand] cannot expand shape " << shape_str(shape()) << " to "
                            << shape_str(target);
    }
  }
  const Shape in_shape = shape();
  return make_view(*this, out, st, offset(), "expand",
                   [in_shape](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                     return {sum_to_shape(g[0], in_shape)};
                   });
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = normalize_dim(d, dim() + 1, "unsqueeze");
  Shape s = shape(), st = strides();
  const int64_t stride = d < dim() ? strides()[d] * shape()[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  const Shape in_shape = shape();
  return make_view(*this, s, st, offset(), "view",
                   [in_shape](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                     return {g[0].reshape(in_shape)};
                   });
}

Tensor Tensor::squeeze(int64_t d) const {
  d = normalize_dim(d, dim(), "squeeze");
  MAMMOTH_CHECK(shape()[d] == 1) << "[squeeze] dim " << d << " has size " << shape()[d]
                                 << ", not 1, in shape " << shape_str(shape());
  Shape s = shape(), st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  const Shape in_shape = shape();
  return make_view(*this, s, st, offset(), "view",
                   [in_shape](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                     return {g[0].reshape(in_shape)};
                   });
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  start = normalize_dim(start, dim(), "flatten");
  end = normalize_dim(end, dim(), "flatten");
  Shape s(shape().begin(), shape().begin() + start);
  int64_t p = 1;
  for (int64_t i = start; i <= end; ++i) p *= shape()[i];
  s.push_back(p);
  s.insert(s.end(), shape().begin() + end + 1, shape().end());
  return reshape(s);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = empty(shape(), dtype(), device());
  {
    NoGradGuard ng;
    copy_(out, *this);
  }
  if (needs_grad({*this})) {
    record("contiguous", {*this}, {&out},
           [](const std::vector<Tensor>& g) -> std::vector<Tensor> { return {g[0]}; });
  }
  return out;
}

Tensor Tensor::to(DType t) const { return cast(*this, t); }

Tensor Tensor::to(Device d) const {
  if (device() == d) return *this;
  const Tensor src = contiguous();
  Tensor out = empty(shape(), dtype(), d);
#ifdef MAMMOTH_WITH_CUDA
  memory::cuda::copy_bytes(out.raw_data(), d, src.raw_data(), src.device(), src.nbytes());
#else
  MAMMOTH_THROW() << "[to] cannot copy from " << device() << " to " << d
                  << ": this build has no CUDA backend";
#endif
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  copy_(out, *this);
  return out;
}

Tensor Tensor::detach() const {
  return Tensor(make_impl(storage(), offset(), shape(), strides(), dtype()));
}

Tensor Tensor::as_strided(const Shape& s, const Shape& st, int64_t off) const {
  MAMMOTH_CHECK(s.size() == st.size()) << "[as_strided] shape and strides differ in length";
  return Tensor(make_impl(storage(), off, s, st, dtype()));
}

// ---- autograd state ----

bool Tensor::requires_grad() const { return impl_ && impl_->requires_grad; }

Tensor& Tensor::requires_grad_(bool value) {
  MAMMOTH_CHECK(!value || is_floating(dtype()))
      << "[requires_grad] only floating-point tensors can require gradients, got "
      << dtype_name(dtype());
  MAMMOTH_CHECK(is_leaf()) << "[requires_grad] can only be set on a leaf tensor";
  checked(impl_);
  impl_->requires_grad = value;
  return *this;
}

bool Tensor::is_leaf() const { return checked(impl_).grad_fn == nullptr; }
Tensor Tensor::grad() const { return checked(impl_).grad; }
void Tensor::set_grad(const Tensor& g) const {
  checked(impl_);
  impl_->grad = g;
}
void Tensor::zero_grad() const { set_grad(Tensor()); }
const std::shared_ptr<Node>& Tensor::grad_fn() const { return checked(impl_).grad_fn; }

void Tensor::backward(const Tensor& gradient) const { run_backward(*this, gradient); }

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  os << "Tensor(shape=" << shape_str(t.shape()) << ", dtype=" << dtype_name(t.dtype())
     << ", device=" << t.device();
  if (t.numel() <= 16 && t.device().is_cpu()) {
    os << ", values=[";
    const std::vector<double> v = t.to_vector();
    for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
    os << "]";
  }
  return os << ")";
}

}  // namespace mammoth::engine
