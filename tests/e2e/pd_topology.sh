#!/usr/bin/env bash
# The seed's PD deployment, scaled down to three "hosts": network namespaces on one bridge
# (iproute2). Host P (10.M.0.1) runs the prefiller with PP=2 and CPP (profiling_chunk_config)
# as kv_producer, and chunkpipe proxy with the seed's flags; hosts D1 (10.M.0.2) and D2
# (10.M.0.3) each run two decoder servers on consecutive ports (7100, 7101), as
# launch_online_dp.py starts one server per DP rank, with the recompute scheduler. The seed's
# verification curl gets a 200 through the proxy, and it and 8 concurrent requests equal a
# colocated server's greedy outputs; every server's KV usage ends at 0. Exits 77 (CTest:
# skipped) without the rights to make namespaces.
# usage: pd_topology.sh CHUNKPIPE_BINARY TOKENIZER_DIR
set -euo pipefail
bin=$1 tok=$2
tag="pd$$"
ns_p="${tag}p" ns_d1="${tag}d1" ns_d2="${tag}d2" ns_sw="${tag}sw"
net=$((100 + ($$ + 77) % 150))
addr_p="10.$net.0.1" addr_d1="10.$net.0.2" addr_d2="10.$net.0.3"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  # $! is a subshell's pid when a server starts through a function: also kill whatever still
  # runs inside the namespaces, so that no server outlives the test.
  for ns in "$ns_p" "$ns_d1" "$ns_d2" "$ns_sw"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

make_hosts() {
  ip netns add "$ns_sw" || return 1
  ip -n "$ns_sw" link add br0 type bridge && ip -n "$ns_sw" link set br0 up || return 1
  local i=0
  for pair in "$ns_p:$addr_p" "$ns_d1:$addr_d1" "$ns_d2:$addr_d2"; do
    local ns=${pair%%:*} addr=${pair#*:}
    i=$((i + 1))
    ip netns add "$ns" &&
      ip link add "${tag}h$i" type veth peer name "${tag}s$i" &&
      ip link set "${tag}h$i" netns "$ns" && ip link set "${tag}s$i" netns "$ns_sw" &&
      ip -n "$ns_sw" link set "${tag}s$i" master br0 && ip -n "$ns_sw" link set "${tag}s$i" up &&
      ip -n "$ns" addr add "$addr/24" dev "${tag}h$i" &&
      ip -n "$ns" link set lo up && ip -n "$ns" link set "${tag}h$i" up || return 1
  done
  ip netns exec "$ns_p" true
}
if ! command -v ip >/dev/null || ! make_hosts 2>/dev/null; then
  echo "SKIP: cannot create network namespaces on a bridge here (needs root and iproute2)"
  exit 77
fi

# A small random model with the full DeepSeek vocabulary, so the seed's chat prompt fits.
model="$work/model"
"$bin" make-model "$model" --hidden 64 --layers 2 --heads 2 --q-lora-rank 32 --kv-lora-rank 32 \
  --qk-nope 16 --qk-rope 16 --v-head 16 --experts 8 --top-k 2 --n-group 2 --topk-group 1 \
  --inter 128 --moe-inter 32 --seed 7 > /dev/null
common=(--tokenizer "$tok" --served-model-name model --max-model-len 4096 --block-size 16
        --kv-cache-memory 60000000 --max-num-batched-tokens 512 --max-num-seqs 16 --threads 1)
kv_base=$((36000 + $$ % 1000 * 8))
layout='"kv_connector_extra_config": {"prefill": {"pp_size": 2, "dp_size": 1, "tp_size": 1},
  "decode": {"dp_size": 4, "tp_size": 1}}'
producer="{\"kv_connector\": \"MooncakeConnectorV1\", \"kv_role\": \"kv_producer\",
  \"kv_port\": \"$kv_base\", \"engine_id\": \"0\", $layout}"
consumer="{\"kv_connector\": \"MooncakeConnectorV1\", \"kv_role\": \"kv_consumer\",
  \"kv_port\": \"$((kv_base + 4))\", \"engine_id\": \"0\", $layout}"

in_ns() { local ns=$1 ip=$2; shift 2; ip netns exec "$ns" env VLLM_HOST_IP="$ip" "$@"; }

# The colocated reference, on P's host loopback.
in_ns "$ns_p" 127.0.0.1 "$bin" serve "$model" "${common[@]}" --host 127.0.0.1 --port 8101 \
  > "$work/colocated.log" 2>&1 &
pids+=($!)
# The prefiller: PP=2 with CPP, as the seed's P node.
in_ns "$ns_p" "$addr_p" "$bin" serve "$model" "${common[@]}" --host 0.0.0.0 --port 8003 \
  --pipeline-parallel-size 2 --enable-chunked-prefill --enable-prefix-caching \
  --additional-config '{ "scheduler_config": { "profiling_chunk_config": {"enabled":true, "smooth_factor":1.0, "min_chunk":64} } }' \
  --kv-transfer-config "$producer" > "$work/p.log" 2>&1 &
pids+=($!)
for host in "$ns_d1:$addr_d1" "$ns_d2:$addr_d2"; do
  ns=${host%%:*} addr=${host#*:}
  for port in 7100 7101; do
    in_ns "$ns" "$addr" "$bin" serve "$model" "${common[@]}" --host 0.0.0.0 --port "$port" \
      --no-enable-prefix-caching \
      --additional-config '{ "scheduler_config": {"recompute_scheduler_enable": true} }' \
      --kv-transfer-config "$consumer" > "$work/d-$ns-$port.log" 2>&1 &
    pids+=($!)
  done
done

wait_ready() {  # namespace, address, port, path
  for _ in $(seq 1 600); do
    if ip netns exec "$1" curl -sf "$2:$3$4" >/dev/null; then return 0; fi
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "FAIL: a server exited"; tail -n 5 "$work"/*.log; exit 1; }; done
    sleep 0.1
  done
  echo "FAIL: $2:$3 did not become ready"; tail -n 5 "$work"/*.log; exit 1
}
wait_ready "$ns_p" 127.0.0.1 8101 /health
wait_ready "$ns_p" "$addr_p" 8003 /health
for a in "$addr_d1" "$addr_d2"; do for port in 7100 7101; do wait_ready "$ns_p" "$a" $port /health; done; done

# The proxy, with the seed's flags (the singular --prefiller-port as the seed writes it).
in_ns "$ns_p" "$addr_p" "$bin" proxy --host "$addr_p" --port 8080 \
  --prefiller-hosts "$addr_p" --prefiller-port 8003 \
  --decoder-hosts "$addr_d1" "$addr_d1" "$addr_d2" "$addr_d2" \
  --decoder-ports 7100 7101 7100 7101 > "$work/proxy.log" 2>&1 &
pids+=($!)
wait_ready "$ns_p" "$addr_p" 8080 /healthcheck

seed_body='{
        "model": "model",
        "messages": [
            {
                "role": "system",
                "content": "You are a useful AI assistant."
            },
            {
                "role": "user",
                "content": "Question: Janet'\''s ducks lay 16 eggs per day. She eats three for breakfast and bakes muffins with four. She sells the remainder for $2 each. How much does she make?\nAnswer:"
            }
        ],
        "max_completion_tokens": 100,
        "temperature": 0
    }'
content() { node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const j=JSON.parse(s);console.log(JSON.stringify(j.choices[0].message?j.choices[0].message.content:j.choices[0].text))})'; }
code=$(ip netns exec "$ns_p" curl -s -o "$work/seed.json" -w '%{http_code}' \
  "http://$addr_p:8080/v1/chat/completions" -H "Content-Type: application/json" -d "$seed_body")
[[ $code == 200 ]] || { echo "FAIL: the seed's curl got HTTP $code"; cat "$work/seed.json"; tail -n 20 "$work/proxy.log"; exit 1; }
got=$(content < "$work/seed.json")
want=$(ip netns exec "$ns_p" curl -sf "http://127.0.0.1:8101/v1/chat/completions" \
  -H "Content-Type: application/json" -d "$seed_body" | content)
[[ "$got" == "$want" ]] || { echo "FAIL: the seed's answer differs from colocated"; echo "$got"; echo "$want"; exit 1; }
echo "the seed's curl through the proxy: HTTP 200, equal to colocated serving"

# 8 concurrent completions (one of 1,500+ tokens), spread over the four decoders.
curls=()
for i in $(seq 0 7); do
  words=$((20 + i * 200))
  prompt=$(seq -s ' ' 1 "$words" | sed 's/[0-9]*/w&/g')
  echo "{\"model\":\"model\",\"prompt\":\"$prompt\",\"max_tokens\":16,\"temperature\":0,\"ignore_eos\":true}" > "$work/req$i.json"
  ip netns exec "$ns_p" curl -sf "http://$addr_p:8080/v1/completions" -H "Content-Type: application/json" \
    -d @"$work/req$i.json" > "$work/pd$i.json" &
  curls+=($!)
done
for c in "${curls[@]}"; do wait "$c" || { echo "FAIL: a request through the proxy failed"; exit 1; }; done
for i in $(seq 0 7); do
  a=$(content < "$work/pd$i.json")
  b=$(ip netns exec "$ns_p" curl -sf "http://127.0.0.1:8101/v1/completions" -H "Content-Type: application/json" \
    -d @"$work/req$i.json" | content)
  [[ "$a" == "$b" ]] || { echo "FAIL: request $i differs from colocated"; echo "$a"; echo "$b"; exit 1; }
done
echo "8 concurrent completions through the proxy equal colocated serving"

metric() { ip netns exec "$ns_p" curl -sf "http://$1/metrics" | awk -v m="$2" '$1 ~ "^"m"[{]" {print $2}'; }
pulled=0
for a in "$addr_d1" "$addr_d2"; do
  for port in 7100 7101; do
    b=$(metric "$a:$port" chunkpipe:kv_pull_bytes_total)
    s=$(metric "$a:$port" chunkpipe:kv_pull_seconds_total)
    echo "decoder $a:$port pulled ${b%.*} bytes in ${s}s"
    pulled=$((pulled + ${b%.*}))
  done
done
[[ $pulled -gt 0 ]] || { echo "FAIL: no decoder pulled KV"; exit 1; }
for _ in $(seq 1 100); do
  busy=0
  for target in "$addr_p:8003" "$addr_d1:7100" "$addr_d1:7101" "$addr_d2:7100" "$addr_d2:7101"; do
    u=$(metric "$target" vllm:kv_cache_usage_perc)
    [[ "$u" == "0.0" || "$u" == "0" ]] || busy=1
  done
  [[ $busy == 0 ]] && break
  sleep 0.1
done
[[ $busy == 0 ]] || { echo "FAIL: KV blocks still held"; exit 1; }
echo "KV usage is 0 on P and on the four decoders"
