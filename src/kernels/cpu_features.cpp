// CPU feature detection with __builtin_cpu_supports, which also checks that the OS saves the
// AVX-512 register state (XCR0), CPUID for the newer features, and the CHUNKPIPE_ISA cap.
#include "kernels/cpu_features.h"

#include <cblas.h>
#include <cpuid.h>

#include <cstdlib>
#include <string_view>

#include "common/logging.h"
#include "kernels/gemm.h"
#include "kernels/int8_paths.h"
#include "kernels/mla_attention.h"

namespace kernels {
namespace {

CpuFeatures intersect(const CpuFeatures& a, const CpuFeatures& b) {
  CpuFeatures r;
  r.avx512 = a.avx512 && b.avx512;
  r.avx512_bf16 = r.avx512 && a.avx512_bf16 && b.avx512_bf16;
  r.avx512_vnni = r.avx512 && a.avx512_vnni && b.avx512_vnni;
  r.avx_vnni = a.avx_vnni && b.avx_vnni;
  r.amx_int8 = r.avx512 && a.amx_int8 && b.amx_int8;
  r.amx_bf16 = r.avx512 && a.amx_bf16 && b.amx_bf16;
  return r;
}

CpuFeatures from_environment() {
  const CpuFeatures detected = detected_cpu_features();
  const char* env = std::getenv("CHUNKPIPE_ISA");
  const std::string_view cap = env ? env : "native";
  if (cap == "native" || cap.empty()) return detected;
  if (cap == "avx512") {
    CpuFeatures r = detected;
    r.avx_vnni = false;
    r.amx_int8 = false;
    r.amx_bf16 = false;
    return r;
  }
  if (cap == "avx2") return CpuFeatures{};
  LOG(WARNING) << "CHUNKPIPE_ISA=" << cap
               << " is not one of avx2, avx512, native; using every detected feature";
  return detected;
}

CpuFeatures& active() {
  static CpuFeatures features = from_environment();
  return features;
}

}  // namespace

CpuFeatures detected_cpu_features() {
  __builtin_cpu_init();
  CpuFeatures f;
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
  f.avx512_vnni = f.avx512 && __builtin_cpu_supports("avx512vnni");
  // AVX-VNNI and AMX straight from CPUID leaf 7 (clang 14's __builtin_cpu_supports does not
  // know them): AVX-VNNI is subleaf 1 EAX bit 4; AMX-BF16, AMX-TILE and AMX-INT8 are subleaf 0
  // EDX bits 22, 24 and 25. The OS grants the AMX tile state later, per process (int8_amx.cpp).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) f.avx_vnni = (eax >> 4) & 1;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    f.amx_int8 = f.avx512 && ((edx >> 24) & 1) && ((edx >> 25) & 1);
    f.amx_bf16 = f.avx512 && ((edx >> 24) & 1) && ((edx >> 22) & 1);
  }
  return f;
}

const CpuFeatures& cpu_features() {
  return active();
}

std::string describe(const CpuFeatures& f) {
  std::string s = "avx2 fma";
  if (f.avx512) s += " avx512";
  if (f.avx512_bf16) s += " avx512_bf16";
  if (f.avx512_vnni) s += " avx512_vnni";
  if (f.avx_vnni) s += " avx_vnni";
  if (f.amx_int8) s += " amx_int8";
  if (f.amx_bf16) s += " amx_bf16";
  return s;
}

std::string kernel_paths_line() {
  const CpuFeatures& f = cpu_features();
  std::string s = "kernel paths (CHUNKPIPE_ISA caps them): linear f32/bf16 streaming ";
  s += f.avx512 ? "avx512" : "avx2";
  // OpenBLAS picks its kernels by CPUID or by OPENBLAS_CORETYPE, which some machines set to an
  // older core (Haswell: AVX2 sgemm at half an AVX-512 core's FMA rate): name the ones it runs.
  const std::string openblas = std::string("openblas (") + openblas_get_corename() + " kernels)";
  // Larger batches: ours on AVX2 and AVX-512, each output the streaming kernel's bits.
  const std::string tiles =
      std::string(f.avx512 ? "avx512" : "avx2") + " (from " +
      std::to_string((f.avx512 ? kStreamingMaxRowsBf16Avx512 : kStreamingMaxRowsBf16) + 1) +
      " tokens on bf16 weights, " + std::to_string(kStreamingMaxRowsF32 + 1) + " on f32)";
  s += ", linear f32/bf16 tiles ";
  s += f.amx_bf16 ? "amx_bf16 (bf16 weights, f32 activations as three exact bf16 terms, weights "
                    "read in place from 8 to 256 tokens; f32 weights " +
                        tiles + ")"
                  : tiles;
  s += ", attention sgemm " + openblas;
  s += ", linear bf16 activations (--dtype bfloat16, or auto on a bfloat16 checkpoint) ";
  s += f.amx_bf16      ? std::string("amx_bf16")
       : f.avx512_bf16 ? "avx512_bf16 (gemv below " + std::to_string(kBf16DotMinRows) + " tokens)"
                       : std::string("rounded, then as f32");
  s += ", mla prefill attention ";
  s += f.avx512 && f.amx_bf16 ? "amx_bf16 (f32 operands as three exact bf16 terms)"
                              : (f.avx512 ? "avx512" : "avx2");
  if (bf16_prefill_attention()) {
    s += f.avx512_bf16 && !f.amx_bf16 ? " with bf16 products (CHUNKPIPE_ATTENTION=bf16)"
                                      : " (CHUNKPIPE_ATTENTION=bf16 needs AVX512_BF16 without AMX)";
  }
  s += ", mla decode attention ";
  s += f.avx512 ? "avx512" : "avx2";
  s += ", linear int8 ";
  s += f.avx512_vnni
           ? "avx512_vnni (tiles from " + std::to_string(detail::kInt8TilesMinTokens) + " tokens)"
           : (f.avx_vnni ? "avx_vnni" : "avx2");
  if (f.amx_int8) s += " (amx_int8 from 16 tokens)";
  s += ", sampler exp ";
  s += f.avx512 ? "avx512" : "avx2";
  s += "; cpu features: " + describe(f);
  return s;
}

ScopedCpuFeatures::ScopedCpuFeatures(const CpuFeatures& features) : saved_(active()) {
  active() = intersect(features, detected_cpu_features());
}

ScopedCpuFeatures::~ScopedCpuFeatures() {
  active() = saved_;
}

}  // namespace kernels
