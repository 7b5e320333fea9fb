// NEON kernels with sdot and smmla, for CPUs with the dotprod and i8mm extensions (e.g.
// Cortex-A510/A710/X2, Neoverse V1/N2, Apple M2); the code is in kernels_neon_impl.h. Built with
// -march=armv8.2-a+dotprod+i8mm.
#include "cpu/kernels_neon_impl.h"

#if !defined(__ARM_FEATURE_DOTPROD) || !defined(__ARM_FEATURE_MATMUL_INT8)
#error "kernels_neon_i8mm.cpp must be built with -march=armv8.2-a+dotprod+i8mm"
#endif

namespace h2o::cpu::detail {
const KernelTable kNeonI8mmKernels = kThisLevelKernels;
}
