// Test helpers: finite-difference gradient checks and tensor comparison.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace mammoth::testing {

using engine::Tensor;

struct GradcheckOptions {
  double eps = 1e-6;   // central-difference step
  double atol = 1e-6;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-5;
};

// Checks d(sum(f(inputs) * R))/d(input) from backward against central differences, for every
// input that requires grad (use f64 inputs). R is a fixed random projection, so every output
// element's gradient path is exercised. Returns "" on success, else a description of the
// worst mismatch.
std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                      const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

// Max |a - b| / (atol + rtol * |b|) <= 1; returns "" or a message naming the worst element.
std::string compare(const Tensor& actual, const Tensor& expected, double rtol, double atol);

// An f64 leaf tensor requiring grad with values from randn(seed) (or uniform [lo, hi)).
Tensor leaf(const engine::Shape& shape, uint64_t seed);
Tensor leaf_uniform(const engine::Shape& shape, uint64_t seed, double lo, double hi);

}  // namespace mammoth::testing
