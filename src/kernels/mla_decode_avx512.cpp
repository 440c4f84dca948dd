// AVX-512 instantiation of the absorbed-form MLA attention (mla_decode_flash.h) with the traits
// of mla_flash_avx512_traits.h. Compiled for AVX-512 by a target pragma that covers only this
// file's own functions; runs only when cpu_features().avx512 is set. Thread-safe.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/mla_attention.h"
#include "kernels/mla_decode_paths.h"
#include "kernels/simd.h"
#include "kernels/target_region.h"

CHUNKPIPE_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq")

#include "kernels/mla_decode_flash.h"
#include "kernels/mla_flash_avx512_traits.h"

namespace kernels::detail {

void mla_decode_split_avx512(const MlaDecodeArgs& a, int64_t r0, int64_t r1, int64_t split,
                             DecodePartial out, DecodeScratch& scratch) {
  FlashDecode<Avx512>(a, scratch).run_split(r0, r1, split, out);
}

}  // namespace kernels::detail

CHUNKPIPE_TARGET_END()
