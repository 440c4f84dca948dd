// Helpers for kernel tests: seeded random data and error measures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu_features.h"
#include "tensor/weight_matrix.h"

namespace testutil {

inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline tensor::WeightMatrix random_matrix(tensor::DType dtype, int64_t rows, int64_t cols,
                                          uint32_t seed) {
  tensor::WeightMatrix m(dtype, rows, cols);
  auto v = random_vector(static_cast<size_t>(rows * cols), seed, 1.0f / std::sqrt(float(cols)));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == tensor::DType::kF32) {
      m.mutable_f32()[i] = v[i];
    } else {
      m.mutable_bf16()[i] = tensor::f32_to_bf16(v[i]);
    }
  }
  return m;
}

// max |a - b| / (1 + |b|) over all elements.
inline double max_rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - b[i]) / (1.0 + std::abs(double(b[i]))));
  }
  return worst;
}

// Every kernel path this machine can run, from the AVX2 baseline up to all detected features:
// tests run each one under kernels::ScopedCpuFeatures and compare it with the reference.
struct IsaPath {
  const char* name;
  kernels::CpuFeatures features;
};
inline std::vector<IsaPath> supported_isa_paths() {
  const kernels::CpuFeatures d = kernels::detected_cpu_features();
  std::vector<IsaPath> paths = {{"avx2", {}}};
  if (d.avx_vnni) paths.push_back({"avx2+avx_vnni", {.avx_vnni = true}});
  if (d.avx512) paths.push_back({"avx512", {.avx512 = true}});
  if (d.avx512 && (d.avx512_vnni || d.avx512_bf16)) {
    kernels::CpuFeatures no_amx = d;
    no_amx.amx_int8 = false;
    paths.push_back({"avx512+vnni", no_amx});
  }
  if (d.amx_int8) paths.push_back({"all, amx", d});
  return paths;
}

}  // namespace testutil
