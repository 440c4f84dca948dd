#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan, build-fuzz/) and runs each on its seed
# corpus for SECONDS (default 30). A crash leaves its reproducer in build-fuzz/crashes/ and
# fails the script. Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(request chat_template jinja_template tokenizer_json safetensors tool_parser stage_message pull_message
  decoder_answer)
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DCMAKE_CXX_COMPILER=clang++ -DCHUNKPIPE_FUZZ=ON -DCHUNKPIPE_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz -j "$(nproc 2>/dev/null || echo 2)" \
  --target "${targets[@]/#/fuzz_}" >/dev/null
mkdir -p build-fuzz/crashes
failed=0
for t in "${targets[@]}"; do
  work="build-fuzz/corpus/$t"
  mkdir -p "$work"
  echo "fuzz: $t for ${seconds}s"
  if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "build-fuzz/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
      -rss_limit_mb=2048 -artifact_prefix="build-fuzz/crashes/$t-" -print_final_stats=1 \
      "$work" "tests/fuzz/corpus/$t" > "build-fuzz/fuzz_$t.log" 2>&1; then
    echo "fuzz: $t FAILED (log: build-fuzz/fuzz_$t.log)"
    tail -40 "build-fuzz/fuzz_$t.log"
    failed=1
  else
    grep -E "stat::number_of_executed_units|cov:" "build-fuzz/fuzz_$t.log" | tail -2
  fi
done
exit $failed
