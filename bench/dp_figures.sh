#!/usr/bin/env bash
# Data parallelism as figures, on one machine in one run: output tokens/s of DP=1 (one engine,
# 2 threads) against DP=2 (two engines of 1 thread, internal load balancing) and DP=2 with the
# experts split over the ranks (lock step), at concurrency 8, 32 and 64; then the lock step's
# cost when only one rank has work (concurrency 1: the other rank runs dummy batches) against
# DP=2 without it. The default model (`chunkpipe make-model` defaults). Prints the CPU and its
# flags first. Usage: bench/dp_figures.sh [REQUESTS_PER_WORKER=4] (after scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
per="${1:-4}"
model=/tmp/chunkpipe_dp_figures_model
[ -f "$model/config.json" ] || ./build/chunkpipe make-model "$model" --seed 5 >/dev/null
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); flags: $(grep -m1 flags /proc/cpuinfo | grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_0-9]*\|avx_vnni' | sort -u | xargs); cores: $(nproc)"
common=(--served-model-name deepseek_v3 --max-model-len 1024 --block-size 16
        --kv-cache-memory 200000000 --max-num-seqs 256 --max-num-batched-tokens 2048)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null || true' EXIT
run() {  # label, port, concurrency list, flags...
  local label=$1 port=$2 conc=$3
  shift 3
  ./build/chunkpipe serve "$model" --host 127.0.0.1 --port "$port" "${common[@]}" "$@" \
    > "/tmp/chunkpipe_dp_figures_$port.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  ./build/serve_load 127.0.0.1 "$port" --concurrency 8 --requests-per-worker 1 >/dev/null  # warm-up
  ./build/serve_load 127.0.0.1 "$port" --concurrency "$conc" --requests-per-worker "$per" \
    --max-tokens 32 | sed "s/^/$label: /"
  curl -s "http://127.0.0.1:$port/metrics" | awk -v l="$label" \
    '/^vllm:generation_tokens_total/ {print l ": " $1 " " $2} /^chunkpipe:dp_dummy_batches_total/ {print l ": " $1 " " $2}'
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
}
run "DP=1, 2 threads" 8401 8,32,64 --threads 2
run "DP=2, 1 thread each" 8402 8,32,64 --threads 1 -dp 2 --data-parallel-rpc-port 29631
run "DP=2 + EP (lock step)" 8403 8,32,64 --threads 1 -dp 2 --data-parallel-rpc-port 29632 \
  --enable-expert-parallel
echo "-- one rank busy (concurrency 1):"
run "DP=2" 8404 1 --threads 1 -dp 2 --data-parallel-rpc-port 29633
run "DP=2 + EP (lock step)" 8405 1 --threads 1 -dp 2 --data-parallel-rpc-port 29634 \
  --enable-expert-parallel
