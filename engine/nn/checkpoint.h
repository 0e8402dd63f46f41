// Activation checkpointing: trade compute for memory by recomputing a block in backward.
//
// checkpoint(fn, inputs) runs fn without recording its graph, so none of the block's
// intermediate activations are kept: only its inputs. Its backward re-runs fn with grad mode on
// (restoring the dropout RNG offset, so the same masks are drawn), then backpropagates the
// incoming gradients through the recomputed graph: parameters used inside fn receive their
// gradients there (their gradient-ready hooks fire too), and the inputs' gradients are returned
// to the outer graph. Results are identical to running fn directly.
#pragma once

#include <functional>
#include <vector>

#include "engine/tensor.h"

namespace mammoth::engine::nn {

using BlockFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

std::vector<Tensor> checkpoint(const BlockFn& fn, const std::vector<Tensor>& inputs);

}  // namespace mammoth::engine::nn
