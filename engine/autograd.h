// Reverse-mode automatic differentiation over a recorded graph.
//
// Each differentiable op that sees an input requiring grad (with grad mode on) records a
// Node: its backward closure and one edge per input (to the input's producing node, or to a
// leaf tensor whose .grad accumulates). Tensor::backward() runs the nodes in dependency order
// and then releases them, freeing saved tensors; running backward through a released node is
// an error. Backward closures run with grad mode off (no double backward).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace mammoth::engine {

bool grad_enabled();

// Disables graph recording in its scope (optimizer steps, evaluation).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Enables graph recording in its scope, e.g. to recompute a block inside a backward (which runs
// with grad mode off); see engine/nn/checkpoint.h.
class GradEnabledGuard {
 public:
  GradEnabledGuard();
  ~GradEnabledGuard();
  GradEnabledGuard(const GradEnabledGuard&) = delete;
  GradEnabledGuard& operator=(const GradEnabledGuard&) = delete;

 private:
  bool previous_;
};

// Gradients of the inputs from the gradients of the outputs. An undefined gradient means zero
// (an output that did not influence the loss; an input that needs none).
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

struct Edge {
  std::shared_ptr<Node> node;  // producer of the input, or null
  int output_nr = 0;
  std::shared_ptr<TensorImpl> leaf;  // a leaf requiring grad, or null
};

class Node {
 public:
  Node(std::string name, std::vector<Edge> edges, int num_outputs, BackwardFn fn)
      : name_(std::move(name)),
        edges_(std::move(edges)),
        num_outputs_(num_outputs),
        fn_(std::move(fn)) {}
  const std::string& name() const { return name_; }
  const std::vector<Edge>& edges() const { return edges_; }
  int num_outputs() const { return num_outputs_; }
  // The module the op ran in; set only under anomaly detection (empty otherwise).
  const std::string& module() const { return module_; }
  void set_module(std::string module) { module_ = std::move(module); }
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs);
  void release();  // frees the closure and saved tensors

 private:
  std::string name_;
  std::vector<Edge> edges_;
  int num_outputs_;
  BackwardFn fn_;
  std::string module_;
  bool released_ = false;
};

// True when grad mode is on and any input requires grad.
bool needs_grad(const std::vector<Tensor>& inputs);

// Records op `name` (which must be in the op list, engine/op_list.h) producing `outputs` from
// `inputs`; marks the outputs as requiring grad. Call only when needs_grad(inputs).
void record(const char* name, const std::vector<Tensor>& inputs,
            const std::vector<Tensor*>& outputs, BackwardFn fn);

// Calls `hook` during every backward that reaches the leaf `param`, right after its gradient
// has received the last contribution of that backward (a parameter used twice, like tied
// embeddings, fires once). Data parallelism starts reducing a gradient bucket from here while
// backward goes on. An empty hook removes it.
void set_grad_ready_hook(const Tensor& param, std::function<void()> hook);

// Runs backward from `root` seeded with `gradient`.
void run_backward(const Tensor& root, const Tensor& gradient);

// Anomaly detection (`train --detect-anomaly`): while enabled, every recorded op checks its
// outputs and every backward node the gradients it returns; the first that holds NaN or inf
// throws mammoth::Error naming the op, its module, the shapes involved and `where` (the rank).
// The module of an op is that of a parameter it reads ("h.1.mlp.c_fc" for
// "h.1.mlp.c_fc.weight"), else that of the op that produced its first input with one, so a
// parameter-free op (gelu, a residual add) is named by the module it follows. Off, the cost is
// one pointer test per recorded op and per backward node. On, each checked tensor is read on
// the host: a debugging mode. Process-wide; not for concurrent training loops.
class AnomalyDetectionScope {
 public:
  AnomalyDetectionScope(const std::vector<std::pair<std::string, Tensor>>& params,
                        std::string where);
  ~AnomalyDetectionScope();
  AnomalyDetectionScope(const AnomalyDetectionScope&) = delete;
  AnomalyDetectionScope& operator=(const AnomalyDetectionScope&) = delete;
};

// Zero-bubble pipelines split a backward into the input gradients (now: the next stage back
// waits for them) and the weight gradients (later, in a bubble). Inside a
// DeferWeightGradsGuard, ops that compute a leaf's gradient by a GEMM of saved tensors
// (linear's weight: dY^T X) push that work to the guard's queue instead of running it; run()
// later computes and accumulates those gradients into the leaves' .grad. A leaf whose gradient
// is deferred has its grad-ready hook fire before the deferred part arrives, so data
// parallelism must reduce after run() (the pipeline runtime does).
class WeightGradQueue {
 public:
  void push(std::function<void()> work) { work_.push_back(std::move(work)); }
  bool empty() const { return work_.empty(); }
  size_t size() const { return work_.size(); }
  // Runs every deferred computation in order (grad mode off), then empties the queue.
  void run();

 private:
  std::vector<std::function<void()>> work_;
};

class DeferWeightGradsGuard {
 public:
  explicit DeferWeightGradsGuard(WeightGradQueue* queue);
  ~DeferWeightGradsGuard();
  DeferWeightGradsGuard(const DeferWeightGradsGuard&) = delete;
  DeferWeightGradsGuard& operator=(const DeferWeightGradsGuard&) = delete;

 private:
  WeightGradQueue* previous_;
};

// The calling thread's active queue, or null (for ops' backward closures).
WeightGradQueue* deferred_weight_grads();
// Adds `g` to the leaf's gradient (as backward does).
void accumulate_grad(const Tensor& leaf, const Tensor& g);

// For a backward closure whose gradient touches few rows (embedding): when `leaf` is a leaf that
// already has a gradient nothing else holds (a tied LM head's, or an earlier micro-batch's),
// calls add(grad) to add the contribution in place and returns true; the closure then returns
// no gradient for that input. False: the closure returns its dense gradient as usual. Spares a
// gradient-sized zero fill and add per step.
bool add_into_leaf_grad(const Tensor& leaf, const std::function<void(const Tensor& grad)>& add);

}  // namespace mammoth::engine
