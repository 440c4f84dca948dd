#!/usr/bin/env bash
# The project's test command: installs dependencies, builds, runs every test with CTest
# (extra args go to ctest). `scripts/test.sh --sanitize` instead runs the instrumented builds:
# ASan + UBSan (leak checking on) over the unit and e2e tests in build-asan/ (not the label avx2
# reruns of the invariance suites on the AVX2 paths, which the default run has), TSan over the
# engine, serve, KV transfer, PD, collectives, TP and DP tests in build-tsan/, then a short bounded run of
# every fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Compiler cache keys relative to the checkout, so a fresh clone elsewhere (CI) reuses them.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
jobs=$(nproc 2>/dev/null || echo 2)
if [ "${1:-}" != "--sanitize" ]; then
  scripts/build.sh
  exec ctest --test-dir build --output-on-failure -j "$jobs" "$@"
fi
shift

sanitized_build() {  # DIR SANITIZERS [TARGET...]
  local dir="$1" sanitizers="$2"
  shift 2
  # -O1: instrumented code compiles much faster than at -O3 and still runs the e2e tests.
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
    -DCHUNKPIPE_SANITIZE="$sanitizers" -DCHUNKPIPE_BUILD_BENCH=OFF >/dev/null
  cmake --build "$dir" -j "$jobs" ${1:+--target "$@"}
}

echo "== ASan + UBSan (build-asan)"
sanitized_build build-asan address,undefined
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=0 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
LSAN_OPTIONS=suppressions="$PWD/tests/sanitizer/lsan.supp":print_suppressions=0 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 1800 \
    -E 'two_host_pipeline_test|two_host_tp_test|two_host_dp_test' -LE avx2 "$@"

echo "== TSan (build-tsan)"
sanitized_build build-tsan thread chunkpipe engine_test serve_e2e_test abuse_e2e_test transfer_test \
  proxy_test pd_e2e_test collectives_test collective_rank tensor_parallel_test tp_e2e_test \
  dp_e2e_test
# OpenBLAS' own threads are not instrumented: keep GEMM single-threaded inside each process.
OPENBLAS_NUM_THREADS=1 \
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions="$PWD/tests/sanitizer/tsan.supp" \
  ctest --test-dir build-tsan --output-on-failure -j "$jobs" --timeout 1800 \
    -R 'engine_test|serve_e2e_test|abuse_e2e_test|transfer_test|proxy_test|pd_e2e_test|collectives_test|tensor_parallel_test|tp_e2e_test|dp_e2e_test' "$@"

echo "== fuzz (build-fuzz)"
scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
