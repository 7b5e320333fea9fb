// NEON kernels for every ARM64 CPU (ARMv8.0); the code is in kernels_neon_impl.h.
#include "cpu/kernels_neon_impl.h"

#if defined(__ARM_FEATURE_DOTPROD) || defined(__ARM_FEATURE_MATMUL_INT8)
#error "kernels_neon.cpp is the ARMv8.0 baseline: build it without +dotprod or +i8mm"
#endif

namespace h2o::cpu::detail {
const KernelTable kNeonKernels = kThisLevelKernels;
}
