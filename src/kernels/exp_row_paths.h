// Internal to kernels: the constants both exp rows share, and the AVX-512 bodies behind
// exp_row.h (exp_row_avx512.cpp), which exp_row.cpp runs when cpu_features().avx512 is set.
// Same contracts as the public functions.
#pragma once

#include <cstdint>

namespace kernels::detail {

// Both paths' constants: ln 2 in fdlibm's hi/lo split, the range where exp is finite and not
// flushed to zero, and the Taylor coefficients.
namespace exp_constants {
constexpr double kLog2e = 1.4426950408889634074;
constexpr double kLn2Hi = 6.93147180369123816490e-01;
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kMax = 709.782712893384;    // exp overflows above
constexpr double kMin = -745.1332191019412;  // exp rounds to 0 below
constexpr int kDegree = 13;

// 1/k! for k = kDegree .. 2, for Horner's rule.
struct Coefficients {
  double c[kDegree - 1];
  constexpr Coefficients() : c() {
    double f = 1;
    for (int k = 2; k <= kDegree; ++k) {
      f *= k;
      c[kDegree - k] = 1.0 / f;
    }
  }
};
inline constexpr Coefficients kCoefficients;
}  // namespace exp_constants

void exp_shifted_avx512(const float* x, int64_t n, float shift, double scale, double* out);
double sum_exp_shifted_avx512(const float* x, int64_t n, double shift);

}  // namespace kernels::detail
