// Internal to kernels: the AVX-512 bodies behind exp_row.h (exp_row_avx512.cpp), which
// exp_row.cpp runs when cpu_features().avx512 is set. Same contracts as the public functions.
#pragma once

#include <cstdint>

namespace kernels::detail {

void exp_shifted_avx512(const float* x, int64_t n, float shift, double scale, double* out);
double sum_exp_shifted_avx512(const float* x, int64_t n, double shift);

}  // namespace kernels::detail
