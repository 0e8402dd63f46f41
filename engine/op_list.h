// The differentiable op inventory of the engine: every front-end op that records autograd.
//
// record() refuses names not listed here, and the gradient-check suite
// (test/engine/gradcheck_test.cc) fails unless it has a case for every name: a new op
// cannot land without a gradient check.
#pragma once

// clang-format off
#define MAMMOTH_ENGINE_OPS(X)                                                           \
  /* elementwise */                                                                     \
  X(add) X(sub) X(mul) X(div) X(neg) X(exp) X(log) X(sqrt) X(rsqrt) X(tanh) X(relu)     \
  X(gelu) X(gelu_tanh) X(silu) X(add_scalar) X(mul_scalar) X(pow_scalar) X(where)       \
  X(masked_fill) X(cast)                                                                \
  /* reductions, linear algebra, normalisation */                                       \
  X(sum) X(sum_squares) X(mean) X(max) X(matmul) X(linear) X(softmax) X(log_softmax)   \
  X(layer_norm) X(rms_norm)                                                             \
  /* embedding, loss, randomness, attention */                                          \
  X(embedding) X(cross_entropy) X(dropout) X(attention) X(rope)                         \
  /* joining, indexing, views */                                                        \
  X(concat) X(split) X(index_select) X(gather) X(view) X(permute) X(slice) X(expand)    \
  X(contiguous)                                                                         \
  /* mixture of experts */                                                              \
  X(grouped_matmul) X(moe_combine)                                                      \
  /* recomputation (engine/nn/checkpoint.h) */                                          \
  X(checkpoint)
// clang-format on

// Differentiable communication (parallel/tensor_parallel, parallel/sequence_parallel): one name
// for every conjugate pair (identity / all-reduce, scatter / gather, all-to-all). They cannot be
// checked in one process; their forward and backward are checked against single-process math
// by the mpirun tests in test/parallel.
#define MAMMOTH_DISTRIBUTED_OPS(X) X(collective)

namespace mammoth::engine {

inline constexpr const char* kDistributedOps[] = {
#define MAMMOTH_ENGINE_OP_NAME(name) #name,
    MAMMOTH_DISTRIBUTED_OPS(MAMMOTH_ENGINE_OP_NAME)
#undef MAMMOTH_ENGINE_OP_NAME
};

inline constexpr const char* kEngineOps[] = {
#define MAMMOTH_ENGINE_OP_NAME(name) #name,
    MAMMOTH_ENGINE_OPS(MAMMOTH_ENGINE_OP_NAME)
#undef MAMMOTH_ENGINE_OP_NAME
};
inline constexpr int kEngineOpCount = sizeof(kEngineOps) / sizeof(kEngineOps[0]);

}  // namespace mammoth::engine
