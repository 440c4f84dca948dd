// AVX-512 instantiation of the blocked MLA prefill attention (mla_flash.h) in f32, with the traits
// of mla_flash_avx512_traits.h. Compiled for AVX-512 by a target pragma that covers only this
// file's own functions; runs only when cpu_features().avx512 is set. Thread-safe.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/mla_attention.h"
#include "kernels/simd.h"
#include "kernels/target_region.h"
#include "kernels/vec_exp.h"

CHUNKPIPE_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq")

#include "kernels/mla_flash.h"
#include "kernels/mla_flash_avx512_traits.h"

namespace kernels::detail {

void mla_prefill_items_avx512(const MlaPrefillArgs& a, int64_t key_begin, int64_t key_end,
                              MlaPrefillState& state, std::atomic<int64_t>& next) {
  FlashPrefill<Avx512>(a, key_begin, key_end, state).run(next);
}

}  // namespace kernels::detail

CHUNKPIPE_TARGET_END()
