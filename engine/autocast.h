// The calling thread's autocast mode: how f32 matmuls compute under mixed precision.
// engine/amp/amp.h sets it with AutocastGuard; the matmul op passes it to its kernel
// (kernels::MatmulCompute). Everything else always computes in its own dtype.
#pragma once

#include "kernels/params.h"

namespace mammoth::engine {

kernels::MatmulCompute autocast_matmul_compute();
void set_autocast_matmul_compute(kernels::MatmulCompute compute);

}  // namespace mammoth::engine
