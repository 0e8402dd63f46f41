#include "engine/autograd.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "engine/op_list.h"
#include "engine/ops.h"
#include "engine/ops/common.h"
#include "engine/profile/profile.h"

namespace mammoth::engine {
namespace {
thread_local bool tls_grad_enabled = true;

bool is_listed_op(const char* name) {
  for (const char* op : kEngineOps) {
    if (std::strcmp(op, name) == 0) return true;
  }
  for (const char* op : kDistributedOps) {
    if (std::strcmp(op, name) == 0) return true;
  }
  return false;
}

// A leaf's .grad += g (with grad mode off). The first gradient is kept as the .grad itself when
// nothing else reads it (detail::overwritable) and it fills its storage, else copied; later
// ones are added over the .grad where it is the leaf's alone (not a view of a data-parallel
// bucket, not held by the caller), else into a new tensor. Saves a parameter-sized copy per step,
// and an allocation per extra micro-batch.
// `owned`: g is the backward pass's own handle (the caller of accumulate_grad may still read its
// g, which a reference count seen through that reference cannot tell).
void accumulate_into(TensorImpl* leaf, const Tensor& g, bool owned) {
  profile::MemTagScope tag(profile::MemTag::kGradients);
  if (!leaf->grad.defined()) {
    const bool adopt = owned && detail::overwritable(g, g) && g.nbytes() == g.storage()->nbytes;
    leaf->grad = adopt ? g : g.is_contiguous() ? g.clone() : g.contiguous();
    // The memory tracer: a backward's buffer that became the gradient counts as one.
    if (adopt && profile::on()) profile::retag(g.storage()->data, profile::MemTag::kGradients);
  } else if (detail::overwritable(leaf->grad, g)) {
    detail::launch(kernels::Kernel::add, {leaf->grad, g}, {leaf->grad});
  } else {
    leaf->grad = add(leaf->grad, g.is_contiguous() ? g : g.contiguous());
  }
}

// a + b, written over whichever of the two nothing else reads (detail::overwritable; the
// add kernel accepts y == a or y == b), else into a new tensor. Where a residual stream's gradient
// meets its branch's, this saves an allocation and a pass of streaming stores.
Tensor accumulate(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  for (const Tensor* into : {&a, &b}) {
    if (detail::overwritable(*into, into == &a ? b : a)) {
      detail::launch(kernels::Kernel::add, {a, b}, {*into});
      return *into;
    }
  }
  return add(a, b);
}

// Anomaly detection's state: null when off (the only cost then is testing this pointer).
struct AnomalyState {
  std::unordered_map<const TensorImpl*, std::string> param_names;
  std::string where;
};
AnomalyState* g_anomaly = nullptr;

std::string tensor_text(const Tensor& t) {
  return t.defined() ? shape_str(t.shape()) + " " + dtype_name(t.dtype()) : "(none)";
}

// NaN and inf counts and the first bad element, for the message (read only on failure).
std::string non_finite_text(const Tensor& t) {
  int64_t nans = 0, infs = 0, first = -1;
  const std::vector<double> v = t.to_vector();
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isfinite(v[i])) continue;
    (std::isnan(v[i]) ? nans : infs) += 1;
    if (first < 0) first = static_cast<int64_t>(i);
  }
  return std::to_string(nans) + " NaN and " + std::to_string(infs) + " inf of " +
         std::to_string(v.size()) + " elements, the first at flat index " + std::to_string(first);
}

bool non_finite(const Tensor& t) { return t.defined() && is_floating(t.dtype()) && !all_finite(t); }

// The module an op being recorded runs in (see AnomalyDetectionScope).
std::string module_of(const std::vector<Tensor>& inputs) {
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    auto it = g_anomaly->param_names.find(t.impl());
    if (it == g_anomaly->param_names.end()) continue;
    const size_t dot = it->second.rfind('.');
    return dot == std::string::npos ? it->second : it->second.substr(0, dot);
  }
  for (const Tensor& t : inputs) {
    if (t.defined() && t.grad_fn() && !t.grad_fn()->module().empty()) return t.grad_fn()->module();
  }
  return "";
}

std::string module_text(const std::string& module) {
  return module.empty() ? "outside any module (before the first parameter)"
                        : "in module '" + module + "'";
}

void check_forward(const char* name, Node& node, const std::vector<Tensor>& inputs,
                   const std::vector<Tensor*>& outputs) {
  node.set_module(module_of(inputs));
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!non_finite(*outputs[i])) continue;
    std::string in;
    for (const Tensor& t : inputs) {
      in += (in.empty() ? "" : ", ") + tensor_text(t);
      auto it = t.defined() ? g_anomaly->param_names.find(t.impl()) : g_anomaly->param_names.end();
      if (it != g_anomaly->param_names.end()) in += " '" + it->second + "'";
    }
    MAMMOTH_THROW() << "[detect-anomaly] " << g_anomaly->where << ": forward op '" << name << "' "
                    << module_text(node.module()) << " produced NaN or inf in output " << i << " "
                    << tensor_text(*outputs[i]) << " (" << non_finite_text(*outputs[i])
                    << "); inputs: " << in;
  }
}

void check_backward(const Node& node, const std::vector<Tensor>& grad_outputs,
                    const std::vector<Tensor>& grad_inputs) {
  for (size_t i = 0; i < grad_inputs.size(); ++i) {
    if (!non_finite(grad_inputs[i])) continue;
    std::string out;
    bool finite_in = true;
    for (const Tensor& g : grad_outputs) {
      out += (out.empty() ? "" : ", ") + tensor_text(g);
      finite_in = finite_in && !non_finite(g);
    }
    MAMMOTH_THROW() << "[detect-anomaly] " << g_anomaly->where << ": backward of op '"
                    << node.name() << "' " << module_text(node.module())
                    << " produced NaN or inf in the gradient of input " << i << " "
                    << tensor_text(grad_inputs[i]) << " (" << non_finite_text(grad_inputs[i])
                    << ") from output gradients " << out
                    << (finite_in ? " (all finite)" : " (not all finite)");
  }
}

}  // namespace

AnomalyDetectionScope::AnomalyDetectionScope(
    const std::vector<std::pair<std::string, Tensor>>& params, std::string where) {
  MAMMOTH_CHECK(g_anomaly == nullptr) << "[detect-anomaly] already enabled";
  auto state = std::make_unique<AnomalyState>();
  for (const auto& [name, p] : params) state->param_names[p.impl()] = name;
  state->where = std::move(where);
  g_anomaly = state.release();
}

AnomalyDetectionScope::~AnomalyDetectionScope() {
  delete g_anomaly;
  g_anomaly = nullptr;
}

bool grad_enabled() { return tls_grad_enabled; }

NoGradGuard::NoGradGuard() : previous_(tls_grad_enabled) { tls_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { tls_grad_enabled = previous_; }

GradEnabledGuard::GradEnabledGuard() : previous_(tls_grad_enabled) { tls_grad_enabled = true; }
GradEnabledGuard::~GradEnabledGuard() { tls_grad_enabled = previous_; }

std::vector<Tensor> Node::apply(const std::vector<Tensor>& grad_outputs) {
  MAMMOTH_CHECK(!released_)
      << "[backward] trying to backward through the graph a second time (node '" << name_
      << "'); its saved tensors were freed after the first backward";
  std::vector<Tensor> grads = fn_(grad_outputs);
  MAMMOTH_CHECK(grads.size() == edges_.size())
      << "[backward] op '" << name_ << "' returned " << grads.size() << " gradients for "
      << edges_.size() << " inputs";
  return grads;
}

void Node::release() {
  fn_ = nullptr;
  released_ = true;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!tls_grad_enabled) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

void record(const char* name, const std::vector<Tensor>& inputs,
            const std::vector<Tensor*>& outputs, BackwardFn fn) {
  MAMMOTH_CHECK(is_listed_op(name))
      << "[autograd] op '" << name << "' is not in engine/op_list.h; add it with a gradient check";
  std::vector<Edge> edges(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined() || !t.requires_grad()) continue;
    if (t.grad_fn()) {
      edges[i].node = t.grad_fn();
      edges[i].output_nr = t.impl()->output_nr;
    } else {
      edges[i].leaf = t.impl_ptr();
    }
  }
  auto node = std::make_shared<Node>(name, std::move(edges), static_cast<int>(outputs.size()),
                                     std::move(fn));
  if (g_anomaly != nullptr) check_forward(name, *node, inputs, outputs);
  for (size_t i = 0; i < outputs.size(); ++i) {
    TensorImpl* impl = outputs[i]->impl();
    impl->requires_grad = true;
    impl->grad_fn = node;
    impl->output_nr = static_cast<int>(i);
  }
}

void set_grad_ready_hook(const Tensor& param, std::function<void()> hook) {
  MAMMOTH_CHECK(param.defined() && param.is_leaf())
      << "[autograd] gradient hooks attach to leaf tensors only";
  param.impl()->grad_ready_hook = std::move(hook);
}

void run_backward(const Tensor& root, const Tensor& gradient) {
  profile::MemTagScope tag(profile::MemTag::kTemporaries);
  profile::BackwardScope backward;
  MAMMOTH_CHECK(root.requires_grad())
      << "[backward] the tensor does not require grad and has no grad_fn";
  Tensor seed = gradient;
  if (!seed.defined()) {
    MAMMOTH_CHECK(root.numel() == 1) << "[backward] a gradient must be given for a non-scalar "
                                        "root of shape "
                                     << shape_str(root.shape());
    seed = Tensor::ones(root.shape(), root.dtype(), root.device());
  }
  MAMMOTH_CHECK(seed.shape() == root.shape())
      << "[backward] gradient shape " << shape_str(seed.shape()) << " differs from the root's "
      << shape_str(root.shape());
  NoGradGuard no_grad;

  if (!root.grad_fn()) {  // a leaf root
    accumulate_into(root.impl(), seed, /*owned=*/false);
    if (root.impl()->grad_ready_hook) root.impl()->grad_ready_hook();
    return;
  }
  // Count, for every node reachable from the root, how many edges point at it.
  // Leaves count their incoming edges too, so their hooks fire after the last contribution.
  std::unordered_map<Node*, int> deps;
  std::unordered_map<TensorImpl*, int> leaf_deps;
  std::vector<Node*> stack{root.grad_fn().get()};
  std::unordered_set<Node*> seen{root.grad_fn().get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->edges()) {
      if (e.leaf) ++leaf_deps[e.leaf.get()];
      if (!e.node) continue;
      ++deps[e.node.get()];
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  std::unordered_map<Node*, std::vector<Tensor>> pending;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;
  pending[root.grad_fn().get()].resize(root.grad_fn()->num_outputs());
  pending[root.grad_fn().get()][root.impl()->output_nr] = seed;
  keep_alive[root.grad_fn().get()] = root.grad_fn();
  std::vector<Node*> ready{root.grad_fn().get()};
  while (!ready.empty()) {
    Node* n = ready.back();
    ready.pop_back();
    std::vector<Tensor> grads_out = std::move(pending[n]);
    pending.erase(n);
    grads_out.resize(n->num_outputs());
    std::vector<Tensor> grads_in = n->apply(grads_out);
    if (g_anomaly != nullptr) check_backward(*n, grads_out, grads_in);
    grads_out.clear();  // no longer read: what only they held is free (or overwritable) now
    const std::vector<Edge>& edges = n->edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (e.leaf) {
        TensorImpl* leaf = e.leaf.get();
        if (grads_in[i].defined()) accumulate_into(leaf, grads_in[i], /*owned=*/true);
        if (--leaf_deps[leaf] == 0 && leaf->grad_ready_hook) leaf->grad_ready_hook();
      } else if (e.node) {
        Node* next = e.node.get();
        auto& slot = pending[next];
        if (slot.empty()) slot.resize(next->num_outputs());
        slot[e.output_nr] = accumulate(slot[e.output_nr], grads_in[i]);
        keep_alive[next] = e.node;
        if (--deps[next] == 0) ready.push_back(next);
      }
    }
    n->release();
  }
}

namespace {
thread_local WeightGradQueue* g_weight_grad_queue = nullptr;
}  // namespace

void WeightGradQueue::run() {
  NoGradGuard ng;
  profile::BackwardScope backward;
  std::vector<std::function<void()>> work;
  work.swap(work_);
  for (auto& w : work) w();
}

DeferWeightGradsGuard::DeferWeightGradsGuard(WeightGradQueue* queue)
    : previous_(g_weight_grad_queue) {
  g_weight_grad_queue = queue;
}

DeferWeightGradsGuard::~DeferWeightGradsGuard() { g_weight_grad_queue = previous_; }

WeightGradQueue* deferred_weight_grads() { return g_weight_grad_queue; }

bool add_into_leaf_grad(const Tensor& leaf, const std::function<void(const Tensor& grad)>& add) {
  if (!leaf.defined() || !leaf.is_leaf()) return false;
  const Tensor& grad = leaf.impl()->grad;
  if (!detail::overwritable(grad, leaf) || grad.dtype() != leaf.dtype()) return false;
  NoGradGuard ng;
  add(grad);
  return true;
}

void accumulate_grad(const Tensor& leaf, const Tensor& g) {
  MAMMOTH_CHECK(leaf.defined() && leaf.is_leaf())
      << "[accumulate_grad] gradients accumulate into leaf tensors only";
  NoGradGuard ng;
  accumulate_into(leaf.impl(), g, /*owned=*/false);
}

}  // namespace mammoth::engine
