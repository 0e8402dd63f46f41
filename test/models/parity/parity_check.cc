// Mammoth side of the model parity test: loads a directory written by reference.py
// (config.json + model.safetensors through models::create_model), runs forward and backward on
// the recorded inputs, and compares logits, loss and every parameter gradient with the
// PyTorch values in expected.safetensors.
//
//   parity_check DIR [f32|f64] [tolerance] [capacity_factor]
//
// capacity_factor: a mixture-of-experts model's token cap (ModelOptions::moe_capacity_factor).
//
// It also writes the loaded model back with save_pretrained to DIR/mammoth_<dtype>, which
// hf_check.py opens with transformers (when installed).
//
// Error per tensor: max |ours - torch| / max |torch|, relative to the tensor's scale so that
// near-zero entries do not dominate. A gradient that is zero in exact arithmetic (attention key
// biases: softmax ignores a constant added to every score; the float64 reference is ~1e-17
// there) is rounding noise on both sides; it is measured against the model's largest gradient.
// Prints one line per tensor and a JSON summary; exits 1 when any error exceeds the tolerance
// (default 1e-4 for f32; 1e-6 for f64, because engine::attention saves its log-sum-exp in f32 and
// the LLaMA path rotates in f32 precision, so f64 gradients are good to ~1e-7, not 1e-15).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "base/error.h"
#include "base/thread_pool.h"
#include "engine/io/safetensors.h"
#include "engine/ops.h"
#include "models/bert/bert.h"
#include "models/registry.h"
#include "models/vit/vit.h"

namespace mammoth::models {
namespace {

using engine::Tensor;

Tensor load(const io::SafetensorsFile& f, const std::string& name) {
  const io::TensorView& v = f.get(name);
  Tensor t = Tensor::empty(v.shape, v.dtype);
  if (v.nbytes > 0) std::memcpy(t.raw_data(), v.data, v.nbytes);
  return t;
}

double rel_error(const Tensor& ours, const Tensor& ref, double floor = 0) {
  MAMMOTH_CHECK(ours.shape() == ref.shape()) << "[parity] shape " << engine::shape_str(ours.shape())
                                             << " vs reference " << engine::shape_str(ref.shape());
  const std::vector<double> a = ours.to_vector(), b = ref.to_vector();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / std::max({scale, floor, 1e-30});
}

int run(int argc, char** argv) {
  MAMMOTH_CHECK(argc >= 2) << "usage: parity_check DIR [f32|f64] [tolerance] [capacity_factor]";
  const std::string dir = argv[1];
  const std::string dt = argc > 2 ? argv[2] : "f32";
  const DType dtype = dt == "f64" ? DType::kF64 : DType::kF32;
  const double tol = argc > 3 ? std::stod(argv[3]) : (dtype == DType::kF64 ? 1e-6 : 1e-4);
  // Single-threaded: the models are tiny, and the CPU thread pool has been seen to hang
  // intermittently (see the models report); parity is about numerics.
  set_num_threads(1);
  ModelOptions options{.dtype = dtype};
  if (argc > 4) options.moe_capacity_factor = std::stod(argv[4]);
  std::shared_ptr<Model> model = create_model(dir, options);
  model->eval();  // no dropout (the reference has none either)
  save_pretrained(*model, dir + "/mammoth_" + dt);
  const io::SafetensorsFile exp = io::SafetensorsFile::open(dir + "/expected.safetensors");

  std::map<std::string, Tensor> outputs;
  Tensor loss;
  switch (model->config().family) {
    case Family::kGpt2:
    case Family::kLlama:
    case Family::kMixtral: {
      auto& lm = dynamic_cast<LanguageModel&>(*model);
      Tensor ids = load(exp, "input.ids");
      outputs["logits"] = lm.forward(ids);
      loss = lm.loss(ids);
      break;
    }
    case Family::kBert: {
      auto& bert = dynamic_cast<Bert&>(*model);
      Tensor hidden = bert.encode(load(exp, "input.ids"), load(exp, "input.token_type_ids"),
                                  load(exp, "input.attention_mask"));
      outputs["logits"] = bert.mlm_logits(hidden);
      outputs["class_logits"] = bert.classify(hidden);
      loss = engine::cross_entropy(outputs["logits"], load(exp, "input.targets")) +
             engine::cross_entropy(outputs["class_logits"], load(exp, "input.labels"));
      break;
    }
    case Family::kVit: {
      auto& vit = dynamic_cast<Vit&>(*model);
      outputs["logits"] = vit.forward(load(exp, "input.pixels").to(dtype));
      loss = engine::cross_entropy(outputs["logits"], load(exp, "input.labels"));
      break;
    }
  }
  outputs["loss"] = loss;
  loss.backward();

  double worst_fwd = 0, worst_grad = 0;
  std::string worst_grad_name;
  int failures = 0;
  for (const auto& [name, t] : outputs) {
    const double e = rel_error(t, load(exp, name));
    worst_fwd = std::max(worst_fwd, e);
    failures += e > tol;
    std::printf("%-60s %.3e%s\n", name.c_str(), e, e > tol ? "  FAIL" : "");
  }
  std::map<std::string, Tensor> params;
  for (const auto& [name, t] : model->named_parameters()) params[name] = t;
  double grad_scale = 0;
  for (const HfParam& p : model->hf_layout().params)
    grad_scale = std::max(grad_scale, engine::max_abs(load(exp, "grad." + p.hf_name)));
  for (const HfParam& p : model->hf_layout().params) {
    Tensor g = params.at(p.param).grad();
    MAMMOTH_CHECK(g.defined()) << "[parity] no gradient for " << p.param;
    if (p.transposed) g = g.transpose(0, 1);
    const Tensor ref = load(exp, "grad." + p.hf_name);
    const bool exact_zero = engine::max_abs(ref) < 1e-10 * grad_scale;
    const double e = rel_error(g, ref, exact_zero ? grad_scale : 0.0);
    if (e > worst_grad) {
      worst_grad = e;
      worst_grad_name = p.hf_name;
    }
    failures += e > tol;
    std::printf("grad.%-55s %.3e%s%s\n", p.hf_name.c_str(), e,
                exact_zero ? " (zero in exact arithmetic)" : "", e > tol ? "  FAIL" : "");
  }
  std::printf(
      "{\"family\": \"%s\", \"dtype\": \"%s\", \"max_rel_forward\": %.3e, \"max_rel_grad\": "
      "%.3e, \"worst_grad\": \"%s\", \"tolerance\": %.1e, \"failures\": %d}\n",
      family_name(model->config().family), dt.c_str(), worst_fwd, worst_grad,
      worst_grad_name.c_str(), tol, failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace mammoth::models

int main(int argc, char** argv) {
  try {
    return mammoth::models::run(argc, argv);
  } catch (const mammoth::Error& e) {
    std::fprintf(stderr, "parity_check: %s\n", e.what());
    return 2;
  }
}
