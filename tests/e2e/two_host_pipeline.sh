#!/usr/bin/env bash
# Two pipeline stages on two "hosts": network namespaces joined by a veth pair (iproute2).
# Node 0 (namespace A, 10.M.0.1) serves the API and stage 0; node 1 (namespace B, 10.M.0.2)
# runs stage 1 with --headless; the stages talk over TCP through the cross-host link. The greedy
# outputs must equal a PP=1 server's, including a prompt prefilled in 10 chunks; after SIGTERM
# on node 0 both nodes exit 0. Then stage 1 is killed mid-stream on node 1: the stream ends with an
# EngineDeadError, node 0 exits 1 and node 1 exits 1, within seconds. Exits 77 (CTest: skipped) without the rights to make namespaces.
# usage: two_host_pipeline.sh CHUNKPIPE_BINARY MODEL_DIR TOKENIZER_DIR
set -euo pipefail
bin=$1 model=$2 tok=$3
source "$(dirname "$0")/two_hosts.sh"

common=(--tokenizer "$tok" --served-model-name m --max-model-len 2048 --block-size 16
        --kv-cache-memory 40000000 --max-num-batched-tokens 64 --max-num-seqs 8 --threads 1)
master_port=$((30000 + $$ % 20000))
pp2=(--pipeline-parallel-size 2 --nnodes 2 --master-addr "$addr_a" --master-port "$master_port")

# PP=1 reference, inside namespace A as well (its own loopback).
ip netns exec "$ns_a" "$bin" serve "$model" "${common[@]}" --host 127.0.0.1 --port 8101 \
  > "$work/pp1.log" 2>&1 &
pids+=($!)
ip netns exec "$ns_a" "$bin" serve "$model" "${common[@]}" "${pp2[@]}" --node-rank 0 \
  --host 127.0.0.1 --port 8102 > "$work/node0.log" 2>&1 &
node0=$!
pids+=($node0)
ip netns exec "$ns_b" "$bin" serve "$model" "${common[@]}" "${pp2[@]}" --node-rank 1 \
  --headless > "$work/node1.log" 2>&1 &
node1=$!
pids+=($node1)

wait_ready 8101
wait_ready 8102

long_prompt=$(seq -s, 1 600 | awk -F, '{for(i=1;i<=NF;i++) printf "%s%d", (i>1?",":""), ($i*37)%500+3}')
prompts=("[5,6,7,8,9,10]" "[400,3,77,12]" "[$long_prompt]")
same_texts 8101 8102 "PP=2 across namespaces differs from PP=1" "${prompts[@]}"
grep -q "Headless node 1 of 2" "$work/node1.log" || { echo "FAIL: node 1 log"; cat "$work/node1.log"; exit 1; }
chunks=$(grep -c "" "$work/want.txt")
echo "PP=1 and PP=2 over $addr_a <-> $addr_b agree on $chunks greedy texts (the long prompt: 600 tokens in chunks of 64)"

stop_nodes "${pids[0]}" "$node0" "$node1"

# A stage on the other host dies mid-request.
pids=()
ip netns exec "$ns_a" "$bin" serve "$model" "${common[@]}" "${pp2[@]}" --node-rank 0 \
  --host 127.0.0.1 --port 8103 > "$work/node0b.log" 2>&1 &
node0=$!
pids+=($node0)
ip netns exec "$ns_b" "$bin" serve "$model" "${common[@]}" "${pp2[@]}" --node-rank 1 \
  --headless > "$work/node1b.log" 2>&1 &
node1=$!
pids+=($node1)
wait_ready 8103
kill_mid_stream 8103 "$node0" "$node1" "pp-stage.*--stage 1 "
