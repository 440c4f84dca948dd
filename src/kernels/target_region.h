// Opens and closes a region of a file compiled for an ISA above the build's AVX2 baseline:
// CHUNKPIPE_TARGET_BEGIN("avx512f,...") before the file's own functions, CHUNKPIPE_TARGET_END()
// after them. Only functions defined inside take the target, so no inline function shared with
// baseline files is built for it. Include every header the region needs before it opens.
#pragma once

#define CHUNKPIPE_PRAGMA(...) _Pragma(#__VA_ARGS__)
#if defined(__clang__)
#define CHUNKPIPE_TARGET_BEGIN(isa) \
  CHUNKPIPE_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define CHUNKPIPE_TARGET_END() CHUNKPIPE_PRAGMA(clang attribute pop)
#else
#define CHUNKPIPE_TARGET_BEGIN(isa) \
  CHUNKPIPE_PRAGMA(GCC push_options) CHUNKPIPE_PRAGMA(GCC target(isa))
#define CHUNKPIPE_TARGET_END() CHUNKPIPE_PRAGMA(GCC pop_options)
#endif
