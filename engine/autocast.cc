#include "engine/autocast.h"

namespace mammoth::engine {
namespace {
thread_local kernels::MatmulCompute t_compute = kernels::MatmulCompute::kNative;
}

kernels::MatmulCompute autocast_matmul_compute() { return t_compute; }
void set_autocast_matmul_compute(kernels::MatmulCompute compute) { t_compute = compute; }

}  // namespace mammoth::engine
