// The x86 SIMD features the kernels may use: detected once from the CPU and the OS, then capped
// by CHUNKPIPE_ISA (avx2 | avx512 | native, default native; avx512 leaves AMX and AVX-VNNI out)
// so that one machine can run every path below its best. Reads are thread-safe; ScopedCpuFeatures
// (tests, benchmarks) must be set before kernels run on other threads. Invariant: the active set is
// a subset of the detected.
#pragma once

#include <string>

namespace kernels {

struct CpuFeatures {
  bool avx512 = false;       // AVX-512 F + BW + VL + DQ: 512-bit f32 and integer paths
  bool avx512_bf16 = false;  // vdpbf16ps
  bool avx512_vnni = false;  // vpdpbusd on 512-bit registers
  bool avx_vnni = false;     // vpdpbusd on 256-bit registers (VEX)
  bool amx_int8 = false;     // AMX tiles with tdpbssd (the OS must also grant the tile state)
  bool amx_bf16 = false;     // AMX tiles with tdpbf16ps (same tile state)

  bool operator==(const CpuFeatures&) const = default;
};

// What the CPU and OS offer (AVX2 + FMA is the build's baseline and is not listed).
CpuFeatures detected_cpu_features();
// What the kernels use now.
const CpuFeatures& cpu_features();

// "avx2 fma avx512 avx512_bf16 ..." of a feature set.
std::string describe(const CpuFeatures& features);
// One line for the start-up log: the ISA path each kernel family takes with cpu_features().
std::string kernel_paths_line();

// Restricts the kernels to `features` (intersected with the detected set) for its lifetime.
class ScopedCpuFeatures {
 public:
  explicit ScopedCpuFeatures(const CpuFeatures& features);
  ~ScopedCpuFeatures();
  ScopedCpuFeatures(const ScopedCpuFeatures&) = delete;
  ScopedCpuFeatures& operator=(const ScopedCpuFeatures&) = delete;

 private:
  CpuFeatures saved_;
};

}  // namespace kernels
