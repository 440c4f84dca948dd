// exp over a row of logits in double precision, for the sampler's weights and log-softmax sums.
// NaN and -inf give 0. The fast versions' exp is within 2 ulp of std::exp (subnormal results
// included) and exactly 1 at 0. Stateless; thread-safe for distinct outputs.
#pragma once

#include <cstdint>

namespace kernels {

// out[i] = exp(double(x[i] - shift) · scale), the subtraction in f32 as the sampler's scalar
// loop did it.
void exp_shifted(const float* x, int64_t n, float shift, double scale, double* out);
void exp_shifted_reference(const float* x, int64_t n, float shift, double scale, double* out);

// The sum of exp(double(x[i]) - shift) over the x that are not NaN (a log-softmax denominator).
// The fast version adds in four lanes, so the sum may differ from the reference's in its last
// bits.
double sum_exp_shifted(const float* x, int64_t n, double shift);
double sum_exp_shifted_reference(const float* x, int64_t n, double shift);

}  // namespace kernels
