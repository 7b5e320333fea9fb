// The avx2+vnni level for CPUs with AVX-VNNI (VEX-encoded vpdpbusd): the AVX2 kernels built again
// with -mavxvnni (see kernels_avx2.cpp).
#define H2O_AVX2_VNNI 1
// Only the matmul is this level's own (kernels.cpp): the file's other kernels go unused here.
#pragma GCC diagnostic ignored "-Wunused-function"
#include "kernels_avx2.cpp"
