// The avx2+vnni level for CPUs with AVX-512 VNNI and VL (EVEX-encoded vpdpbusd on 256-bit
// registers): the AVX2 kernels built again with -mavx512vnni -mavx512vl (see kernels_avx2.cpp).
#define H2O_AVX2_VNNI 1
#define H2O_AVX2_VNNI_EVEX 1
// Only the matmul is this level's own (kernels.cpp): the file's other kernels go unused here.
#pragma GCC diagnostic ignored "-Wunused-function"
#include "kernels_avx2.cpp"
