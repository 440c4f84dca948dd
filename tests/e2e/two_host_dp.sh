#!/usr/bin/env bash
# Data parallelism across two "hosts" (network namespaces joined by a veth pair).
#  1. The seed's single-instance two-node pair, scaled down to DP=2 with one rank per node and
#     TP 2: node 0 (A) serves the API and rank 0, node 1 (B, --headless
#     --data-parallel-start-rank 1) runs rank 1, and the experts are split over all 4 ranks of
#     DP x TP (lock step, collectives through gloo, balance scheduling as the seed exports it),
#     each drafting 3 MTP tokens per step as the seed does. The seed's verification curl gets a
#     200 and the greedy texts equal a DP=1 server's. SIGTERM on node 0 stops both nodes with
#     status 0; kill -9 of rank 1's engine mid-stream ends the stream with an error and both
#     nodes with 1.
#  2. The seed's D nodes, scaled to 4 ranks: `chunkpipe launch-dp` on each host runs
#     ./run_dp_template.sh (the seed's 7 positional arguments, `vllm serve` through
#     tools/vllm-shim on PATH) for 2 ranks on ports 7100-7101, one expert-parallel group of 4
#     with an lm_head group of 2. A prefiller on A and `chunkpipe proxy` with the seed's flags
#     serve through them, P and D with MTP (k = 1; the MTP layer's KV moves with the rest): the seed's curl gets a 200, and greedy texts through the proxy equal
#     DP=1 colocated serving.
# Exits 77 (CTest: skipped) without the rights to make namespaces.
# usage: two_host_dp.sh CHUNKPIPE_BINARY TOKENIZER_DIR
set -euo pipefail
bin=$(realpath "$1") tok=$(realpath "$2")
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/two_hosts.sh"

model="$work/model"  # the full vocabulary, so that the seed's chat prompt fits
"$bin" make-model "$model" --hidden 64 --layers 2 --heads 2 --q-lora-rank 32 --kv-lora-rank 32 \
  --qk-nope 16 --qk-rope 16 --v-head 16 --experts 8 --top-k 2 --n-group 2 --topk-group 1 \
  --inter 128 --moe-inter 32 --seed 7 > /dev/null
common=(--tokenizer "$tok" --max-model-len 2048 --block-size 16 --kv-cache-memory 40000000
        --threads 1)
names=(--served-model-name deepseek_v3 m)  # the seed's name, and the one texts() sends

ip netns exec "$ns_a" "$bin" serve "$model" "${common[@]}" "${names[@]}" --host 127.0.0.1 \
  --port 8301 > "$work/dp1.log" 2>&1 &
ref=$!
pids+=($ref)

# 1. The seed's pair (its TP 4 is scaled to 2), MTP with 3 drafts included.
seed=(--data-parallel-size 2 --data-parallel-size-local 1 --data-parallel-address "$addr_a"
      --data-parallel-rpc-port 13389 --tensor-parallel-size 2 --quantization ascend --seed 1024
      "${names[@]}" --enable-expert-parallel --max-num-seqs 16 --max-num-batched-tokens 4096
      --trust-remote-code --no-enable-prefix-caching --gpu-memory-utilization 0.92
      --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}'
      --speculative-config '{"num_speculative_tokens": 3, "method": "mtp"}')
start_pair() {  # log suffix; sets node0 and node1
  ip netns exec "$ns_a" env VLLM_HOST_IP="$addr_a" VLLM_ASCEND_BALANCE_SCHEDULING=1 "$bin" serve \
    "$model" "${common[@]}" "${seed[@]}" --host 0.0.0.0 --port 8004 > "$work/node0$1.log" 2>&1 &
  node0=$!
  pids+=($node0)
  ip netns exec "$ns_b" env VLLM_HOST_IP="$addr_b" VLLM_ASCEND_BALANCE_SCHEDULING=1 "$bin" serve \
    "$model" "${common[@]}" "${seed[@]}" --port 8004 --headless --data-parallel-start-rank 1 \
    > "$work/node1$1.log" 2>&1 &
  node1=$!
  pids+=($node1)
}
start_pair ""
wait_ready 8301
wait_ready 8004

seed_curl() {  # URL -> HTTP status; the body in $work/seed.json
  ip netns exec "$ns_a" curl -s -o "$work/seed.json" -w '%{http_code}' "$1/v1/chat/completions" \
    -H "Content-Type: application/json" \
    -d '{
        "model": "deepseek_v3",
        "messages": [{
            "role": "user",
            "content": [
            {
                "type": "text",
                "text": "The future of AI is"
            }]
        }],
        "max_tokens": 1024,
        "temperature": 1.0,
        "top_p": 0.95
    }'
}
code=$(seed_curl "http://127.0.0.1:8004")
[[ $code == 200 ]] && grep -q '"choices"' "$work/seed.json" ||
  { echo "FAIL: the seed's curl got HTTP $code"; cat "$work/seed.json"; tail -n 20 "$work"/node*.log; exit 1; }
echo "the seed's verification curl on the DP=2 pair: HTTP 200"
long_prompt=$(seq -s, 1 300 | awk -F, '{for(i=1;i<=NF;i++) printf "%s%d", (i>1?",":""), ($i*37)%5000+3}')
prompts=("[5,6,7,8,9,10]" "[400,3,77,12]" "[$long_prompt]" "\"The future of AI is\"")
same_texts 8301 8004 "DP=2 across namespaces differs from DP=1" "${prompts[@]}"
grep -q "with the experts over all 4 ranks of DP x TP, in lock step over gloo" "$work/node1.log" ||
  { echo "FAIL: rank 1 is not in lock step over gloo"; cat "$work/node1.log"; exit 1; }
grep -q "Balance scheduling: while a data-parallel rank runs" "$work/node1.log" ||
  { echo "FAIL: the seed's VLLM_ASCEND_BALANCE_SCHEDULING=1 did not apply"; exit 1; }
for r in 0 1 2 3; do
  grep -q "experts $((2 * r))-$((2 * r + 1)) whole (expert-parallel rank $r of 4 over DP x TP)" \
    "$work"/node*.log || { echo "FAIL: no expert-parallel rank $r"; cat "$work"/node*.log; exit 1; }
done
for e in 0 1; do
  n=$(ip netns exec "$ns_a" curl -sf 127.0.0.1:8004/metrics |
      awk -v e="engine=\"$e\"" '$1 ~ "^vllm:generation_tokens_total[{]" && index($1, e) {print $2}')
  awk -v n="$n" 'BEGIN {exit !(n > 0)}' || { echo "FAIL: engine $e generated nothing ($n)"; exit 1; }
done
echo "DP=1 and DP=2 x TP=2 + EP (gloo over $addr_a <-> $addr_b) agree on $(grep -c "" "$work/want.txt") greedy texts; both engines served"
kill -TERM "$node0"
rc0=0 rc1=0
wait "$node0" || rc0=$?
timeout 30 tail --pid="$node1" -f /dev/null || true
wait "$node1" || rc1=$?
[[ $rc0 -eq 0 && $rc1 -eq 0 ]] ||
  { echo "FAIL: exit codes node0=$rc0 node1=$rc1"; tail -n 8 "$work"/node*.log; exit 1; }
echo "SIGTERM on node 0: both nodes exited 0"
# kill -9 of rank 1's engine mid-stream: rank 0's gloo group sees the loss at once (a send that
# gloo leaves blocked ends the process a second later), the stream gets an error event, and both
# nodes exit 1 instead of waiting out the collective timeout.
pids=($ref)
start_pair ".kill"
wait_ready 8004
kill_mid_stream 8004 "$node0" "$node1" "serve.*--data-parallel-rank 1 "
pids=($ref)

# 2. launch-dp: the seed's D nodes, 2 ranks per host.
kv_base=$((36000 + $$ % 1000 * 8))
layout='"kv_connector_extra_config": {"prefill": {"pp_size": 1, "dp_size": 1, "tp_size": 1},
  "decode": {"dp_size": 4, "tp_size": 1}}'
producer="{\"kv_connector\": \"MooncakeConnectorV1\", \"kv_role\": \"kv_producer\",
  \"kv_port\": \"$kv_base\", \"engine_id\": \"0\", $layout}"
launch="$work/launch"
mkdir -p "$launch"
cat > "$launch/run_dp_template.sh" <<EOF
#!/bin/sh
# The seed's D-node template: \$1 devices, \$2 port, \$3 dp size, \$4 dp rank, \$5 dp address,
# \$6 dp rpc port, \$7 tp size (scaled: 4 ranks, lm_head groups of 2, a small model).
export OMP_NUM_THREADS=1
export VLLM_HOST_IP=\$LOCAL_IP
export ASCEND_RT_VISIBLE_DEVICES=\$1
vllm serve $model \\
    --host \$LOCAL_IP \\
    --port \$2 \\
    --data-parallel-size \$3 \\
    --data-parallel-rank \$4 \\
    --data-parallel-address \$5 \\
    --data-parallel-rpc-port \$6 \\
    --tensor-parallel-size \$7 \\
    --enable-expert-parallel \\
    --seed 1024 \\
    --served-model-name deepseek_v3 m \\
    --max-model-len 2048 \\
    --max-num-batched-tokens 256 \\
    --max-num-seqs 28 \\
    --trust-remote-code \\
    --gpu-memory-utilization 0.92 \\
    --quantization ascend \\
    --no-enable-prefix-caching \\
    --tokenizer $tok --block-size 16 --kv-cache-memory 20000000 \\
    --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}' \\
    --speculative-config '{"num_speculative_tokens": 1, "method": "mtp"}' \\
    --additional-config '{"recompute_scheduler_enable": true, "multistream_overlap_shared_expert": true, "finegrained_tp_config": {"lmhead_tensor_parallel_size": 2}}' \\
    --kv-transfer-config '{"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer", "kv_port": "$((kv_base + 4))", "engine_id": "0", $(echo "$layout" | tr '\n' ' ')}'
EOF
shim="$(cd "$here/../../tools/vllm-shim" && pwd)"
launch_node() {  # namespace, address, first rank
  (cd "$launch" && exec ip netns exec "$1" env PATH="$shim:$PATH" CHUNKPIPE="$bin" LOCAL_IP="$2" \
    "$bin" launch-dp --dp-size 4 --tp-size 1 --dp-size-local 2 --dp-rank-start "$3" \
    --dp-address "$addr_a" --dp-rpc-port 12321 --vllm-start-port 7100) > "$work/launch$3.log" 2>&1 &
}
launch_node "$ns_a" "$addr_a" 0
launcher_a=$!
pids+=($launcher_a)
launch_node "$ns_b" "$addr_b" 2
launcher_b=$!
pids+=($launcher_b)
ip netns exec "$ns_a" env VLLM_HOST_IP="$addr_a" "$bin" serve "$model" "${common[@]}" "${names[@]}" \
  --host "$addr_a" --port 8003 --kv-transfer-config "$producer" \
  --speculative-config '{"num_speculative_tokens": 1, "method": "mtp"}' > "$work/p.log" 2>&1 &
pids+=($!)
wait_at() {  # address, port, path
  for _ in $(seq 1 600); do
    if ip netns exec "$ns_a" curl -sf "$1:$2$3" >/dev/null; then return 0; fi
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "FAIL: a process exited"; tail -n 8 "$work"/*.log; exit 1; }; done
    sleep 0.1
  done
  echo "FAIL: $1:$2 did not become ready"; tail -n 8 "$work"/*.log; exit 1
}
for a in "$addr_a" "$addr_b"; do for port in 7100 7101; do wait_at "$a" $port /health; done; done
wait_at "$addr_a" 8003 /health
grep -q "data-parallel rank 3: port 7101" "$work/launch2.log" ||
  { echo "FAIL: launch-dp on B did not start rank 3 on port 7101"; cat "$work/launch2.log"; exit 1; }
echo "launch-dp: 4 ranks on ports 7100-7101 of $addr_a and $addr_b"

ip netns exec "$ns_a" env VLLM_HOST_IP="$addr_a" "$bin" proxy --host "$addr_a" --port 8080 \
  --prefiller-hosts "$addr_a" --prefiller-port 8003 \
  --decoder-hosts "$addr_a" "$addr_a" "$addr_b" "$addr_b" \
  --decoder-ports 7100 7101 7100 7101 > "$work/proxy.log" 2>&1 &
pids+=($!)
wait_at "$addr_a" 8080 /healthcheck
code=$(seed_curl "http://$addr_a:8080")
[[ $code == 200 ]] && grep -q '"choices"' "$work/seed.json" ||
  { echo "FAIL: the seed's curl through the proxy got HTTP $code"; cat "$work/seed.json"; tail -n 20 "$work/proxy.log"; exit 1; }
echo "the seed's verification curl through the proxy and the launched ranks: HTTP 200"
proxy_texts() {
  for p in "$@"; do
    ip netns exec "$ns_a" curl -sf "$addr_a:8080/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"model\":\"m\",\"prompt\":$p,\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true}" |
      node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.stringify(JSON.parse(s).choices[0].text)))'
  done
}
texts 8301 "${prompts[@]}" "${prompts[@]}" > "$work/want2.txt"
proxy_texts "${prompts[@]}" "${prompts[@]}" > "$work/got2.txt"
cmp -s "$work/want2.txt" "$work/got2.txt" ||
  { echo "FAIL: PD through the launched DP ranks differs from DP=1"; diff "$work/want2.txt" "$work/got2.txt"; exit 1; }
pulled=0
for a in "$addr_a" "$addr_b"; do for port in 7100 7101; do
  b=$(ip netns exec "$ns_a" curl -sf "$a:$port/metrics" | awk '$1 ~ "^chunkpipe:kv_pull_bytes_total[{]" {print $2}')
  pulled=$(awk -v x="$pulled" -v y="$b" 'BEGIN {print x + y}')
done; done
awk -v n="$pulled" 'BEGIN {exit !(n > 0)}' || { echo "FAIL: the decoders pulled no KV"; exit 1; }
grep -q "rank 3 of 4 in lock step over gloo: experts 6-7, lm_head group of 2" "$work/launch2.log" ||
  { echo "FAIL: rank 3 is not in lock step with its experts and lm_head group"; grep -h "lock step" "$work"/launch*.log; exit 1; }
echo "8 greedy texts through the proxy equal DP=1 colocated serving; the decoders pulled $pulled bytes of KV"
kill -TERM "$launcher_a" "$launcher_b"
rca=0 rcb=0
wait "$launcher_a" || rca=$?
wait "$launcher_b" || rcb=$?
[[ $rca -eq 0 && $rcb -eq 0 ]] || { echo "FAIL: launch-dp exit codes $rca $rcb"; tail -n 5 "$work"/launch*.log; exit 1; }
left=$(ip netns pids "$ns_b" | wc -l)
[[ $left -eq 0 ]] || { echo "FAIL: $left processes left on B after SIGTERM to launch-dp"; exit 1; }
echo "SIGTERM to launch-dp stopped every rank"
