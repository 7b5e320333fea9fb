// NEON kernels with sdot, for CPUs with the dotprod extension (ARMv8.2+, e.g. Cortex-A55/A76,
// Neoverse N1); the code is in kernels_neon_impl.h. Built with -march=armv8.2-a+dotprod.
#include "cpu/kernels_neon_impl.h"

#if !defined(__ARM_FEATURE_DOTPROD) || defined(__ARM_FEATURE_MATMUL_INT8)
#error "kernels_neon_dotprod.cpp must be built with -march=armv8.2-a+dotprod (and without +i8mm)"
#endif

namespace h2o::cpu::detail {
const KernelTable kNeonDotprodKernels = kThisLevelKernels;
}
