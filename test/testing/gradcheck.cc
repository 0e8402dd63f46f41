#include "test/testing/gradcheck.h"

#include <cmath>
#include <sstream>

#include "engine/autograd.h"
#include "engine/ops.h"

namespace mammoth::testing {

using engine::NoGradGuard;

Tensor leaf(const engine::Shape& shape, uint64_t seed) {
  Tensor t = Tensor::randn(shape, seed, 0.0, 1.0, DType::kF64);
  t.requires_grad_();
  return t;
}

Tensor leaf_uniform(const engine::Shape& shape, uint64_t seed, double lo, double hi) {
  Tensor t = Tensor::rand(shape, seed, lo, hi, DType::kF64);
  t.requires_grad_();
  return t;
}

std::string compare(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  if (actual.shape() != expected.shape()) {
    return "shape " + engine::shape_str(actual.shape()) + " vs expected " +
           engine::shape_str(expected.shape());
  }
  const std::vector<double> a = actual.to_vector(), e = expected.to_vector();
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::fabs(a[i] - e[i]);
    const double err = diff == 0 ? 0 : diff / (atol + rtol * std::fabs(e[i]));
    if (!(err <= worst)) {  // NaN counts as worst
      worst = err;
      at = i;
      if (std::isnan(err)) break;
    }
  }
  if (worst <= 1.0) return "";
  std::ostringstream os;
  os << "element " << at << ": got " << a[at] << ", expected " << e[at] << " (error ratio " << worst
     << ")";
  return os.str();
}

std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                      const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  // Analytic: backward of sum(f(x) * R).
  Tensor out = f(inputs);
  const Tensor proj = Tensor::randn(out.shape(), 12345, 0.0, 1.0, out.dtype());
  auto scalar_of = [&](const Tensor& y) { return engine::sum(engine::mul(y, proj)); };
  for (const Tensor& t : inputs) t.zero_grad();
  scalar_of(out).backward();
  std::ostringstream report;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    Tensor analytic = x.grad();
    if (!analytic.defined()) analytic = Tensor::zeros(x.shape(), x.dtype());
    // Numeric: perturb each element of a contiguous x in place.
    MAMMOTH_CHECK(x.is_contiguous() && x.dtype() == DType::kF64)
        << "[gradcheck] inputs must be contiguous f64";
    std::vector<double> numeric(static_cast<size_t>(x.numel()));
    double* data = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      NoGradGuard ng;
      const double orig = data[i];
      data[i] = orig + options.eps;
      const double plus = scalar_of(f(inputs)).item();
      data[i] = orig - options.eps;
      const double minus = scalar_of(f(inputs)).item();
      data[i] = orig;
      numeric[i] = (plus - minus) / (2 * options.eps);
    }
    const std::string err = compare(analytic, Tensor::from_vector(numeric, x.shape(), DType::kF64),
                                    options.rtol, options.atol);
    if (!err.empty())
      report << "input " << k << " " << engine::shape_str(x.shape()) << ": " << err << "; ";
  }
  return report.str();
}

}  // namespace mammoth::testing
