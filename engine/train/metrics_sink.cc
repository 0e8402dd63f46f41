#include "engine/train/metrics_sink.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"

namespace mammoth::engine::train {

namespace {

// The numbers of a step's extra metrics as TensorBoard scalars, one tag per number: "train/"
// then the path of object keys and array indices ("train/moe_load/0/tokens/3").
void add_extra_scalars(const json::Value& v, const std::string& tag,
                       std::vector<std::pair<std::string, float>>& out) {
  if (v.is_number()) {
    out.emplace_back(tag, static_cast<float>(v.as_double()));
  } else if (v.is_object()) {
    for (const json::Value& m : v) add_extra_scalars(m, tag + "/" + m.key(), out);
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i)
      add_extra_scalars(v[i], tag + "/" + std::to_string(i), out);
  }
}

}  // namespace

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return buf;
}

MetricsSink::MetricsSink(const MetricsSinkOptions& options) : options_(options) {
  if (!options_.tensorboard_dir.empty())
    tensorboard_ = std::make_unique<TensorBoardWriter>(options_.tensorboard_dir);
  if (!options_.metrics_path.empty()) {
    metrics_.open(options_.metrics_path, options_.append ? std::ios::app : std::ios::trunc);
    MAMMOTH_CHECK(metrics_.good()) << "[train] cannot open --metrics " << options_.metrics_path
                                   << ": " << std::strerror(errno);
  }
}

MetricsSink::~MetricsSink() = default;

void MetricsSink::record(const StepRecord& r) {
  const bool evaluated = !std::isnan(r.val_loss);
  if (metrics_.is_open()) {
    json::Value m = json::Value::object();
    m.set("step", json::Value(r.step));
    // JSON has no inf/NaN: a skipped fp16 step's non-finite values are written as null.
    auto number = [](double d) { return std::isfinite(d) ? json::Value(d) : json::Value(); };
    m.set("loss", number(r.loss));
    m.set("lr", json::Value(r.lr));
    m.set("grad_norm", number(r.grad_norm));
    m.set("loss_scale", json::Value(r.loss_scale));
    m.set("skipped_steps", json::Value(r.skipped_steps));
    if (!r.applied) m.set("skipped", json::Value(true));
    m.set("tokens_per_s", json::Value(r.tokens_per_s));
    m.set("step_s", json::Value(r.step_s));
    m.set("cpu_s", json::Value(r.cpu_s));
    if (r.predicted_step_s > 0) m.set("predicted_step_s", json::Value(r.predicted_step_s));
    if (r.mfu > 0) m.set("mfu", json::Value(r.mfu));
    m.set("peak_mem_bytes", json::Value(r.peak_mem_bytes));
    if (r.predicted_peak_mem_bytes > 0)
      m.set("predicted_peak_mem_bytes", json::Value(r.predicted_peak_mem_bytes));
    if (evaluated) m.set("val_loss", json::Value(r.val_loss));
    if (!std::isnan(r.val_accuracy)) m.set("val_accuracy", json::Value(r.val_accuracy));
    if (!r.offload.is_null()) m.set("offload", r.offload);
    if (!r.grad_norms.is_null()) m.set("grad_norms", r.grad_norms);
    if (r.extra.is_object())
      for (const json::Value& e : r.extra) m.set(e.key(), e);
    metrics_ << json::dump(m) << "\n";
    metrics_.flush();
    // A full disk or a failing device shows here, not at open; a metrics file with holes
    // would pass for a complete run.
    MAMMOTH_CHECK(metrics_.good()) << "[train] writing --metrics " << options_.metrics_path
                                   << " failed (disk full?): " << std::strerror(errno);
  }
  if (tensorboard_) {
    std::vector<std::pair<std::string, float>> scalars = {
        {"train/loss", static_cast<float>(r.loss)},
        {"train/lr", static_cast<float>(r.lr)},
        {"train/grad_norm", static_cast<float>(r.grad_norm)},
        {"train/tokens_per_s", static_cast<float>(r.tokens_per_s)},
        {"train/peak_mem_bytes", static_cast<float>(r.peak_mem_bytes)}};
    if (r.scaling) {
      scalars.emplace_back("train/loss_scale", static_cast<float>(r.loss_scale));
      scalars.emplace_back("train/skipped_steps", static_cast<float>(r.skipped_steps));
    }
    if (r.mfu > 0) scalars.emplace_back("train/mfu", static_cast<float>(r.mfu));
    if (evaluated) scalars.emplace_back("val/loss", static_cast<float>(r.val_loss));
    if (!std::isnan(r.val_accuracy))
      scalars.emplace_back("val/accuracy", static_cast<float>(r.val_accuracy));
    if (r.extra.is_object()) add_extra_scalars(r.extra, "train", scalars);
    tensorboard_->add_scalars(r.step, scalars);
    tensorboard_->flush();
  }
  if (options_.console &&
      (r.step % std::max<int64_t>(options_.log_every, 1) == 0 || r.step == r.steps || evaluated)) {
    std::fprintf(stderr, "step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | ETA %s",
                 static_cast<long long>(r.step), static_cast<long long>(r.steps), r.loss, r.lr,
                 r.grad_norm, r.tokens_per_s, format_duration(r.eta_s).c_str());
    if (evaluated) std::fprintf(stderr, " | val %.4f", r.val_loss);
    if (!std::isnan(r.val_accuracy)) std::fprintf(stderr, " | val acc %.4f", r.val_accuracy);
    if (r.scaling) std::fprintf(stderr, " | scale %g", r.loss_scale);
    if (!r.applied) std::fprintf(stderr, " | skipped (inf/NaN gradients)");
    std::fprintf(stderr, "\n");
  }
}

}  // namespace mammoth::engine::train
