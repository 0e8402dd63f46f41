#include "engine/nn/checkpoint.h"

#include "engine/autograd.h"
#include "engine/nn/rng.h"
#include "engine/ops.h"

namespace mammoth::engine::nn {

std::vector<Tensor> checkpoint(const BlockFn& fn, const std::vector<Tensor>& inputs) {
  if (!needs_grad(inputs) && !grad_enabled()) return fn(inputs);
  const RngState rng_before = rng_state();
  std::vector<Tensor> outputs;
  {
    NoGradGuard ng;
    outputs = fn(inputs);
  }
  if (!grad_enabled()) return outputs;
  std::vector<Tensor*> out_ptrs;
  for (Tensor& t : outputs) out_ptrs.push_back(&t);
  std::vector<Tensor> saved;
  for (const Tensor& t : inputs) saved.push_back(t.defined() ? t.detach() : t);
  std::vector<bool> wants;
  for (const Tensor& t : inputs) wants.push_back(t.defined() && t.requires_grad());
  // The block's parameters are leaves inside fn: the node must exist even when no input
  // requires grad, so record against the inputs and let the recomputation reach the leaves.
  record("checkpoint", inputs, out_ptrs,
         [fn, saved, wants, rng_before](const std::vector<Tensor>& grads) {
           // Recompute with the same dropout stream, then put the stream back where it was.
           const RngState rng_now = rng_state();
           rng_state() = rng_before;
           std::vector<Tensor> leaves;
           for (size_t i = 0; i < saved.size(); ++i) {
             Tensor leaf = saved[i].defined() ? saved[i].detach() : saved[i];
             if (wants[i]) leaf.requires_grad_(true);
             leaves.push_back(leaf);
           }
           std::vector<Tensor> recomputed;
           {
             GradEnabledGuard on;
             recomputed = fn(leaves);
             // One backward through the recomputed block: sum_i <out_i, grad_i>.
             Tensor total;
             for (size_t i = 0; i < recomputed.size(); ++i) {
               if (!grads[i].defined() || !recomputed[i].requires_grad()) continue;
               Tensor term = sum(mul(recomputed[i], grads[i]));
               total = total.defined() ? add(total, term) : term;
             }
             if (total.defined()) total.backward();
           }
           rng_state() = rng_now;
           std::vector<Tensor> input_grads;
           for (size_t i = 0; i < leaves.size(); ++i) {
             input_grads.push_back(wants[i] ? leaves[i].grad() : Tensor());
           }
           return input_grads;
         });
  return outputs;
}

}  // namespace mammoth::engine::nn
