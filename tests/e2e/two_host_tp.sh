#!/usr/bin/env bash
# Tensor parallelism across two "hosts" (network namespaces joined by a veth pair): node 0
# (namespace A) serves the API and TP rank 0, node 1 (namespace B, --headless) runs TP rank 1,
# and the ranks' collectives go through gloo over the veth pair. The greedy outputs must equal
# a TP=1 server's; after SIGTERM on node 0 both nodes exit 0. Then rank 1 is killed mid-stream:
# the stream ends with an EngineDeadError and both nodes exit 1 within seconds. Exits 77
# (CTest: skipped) without the rights to make namespaces.
# usage: two_host_tp.sh CHUNKPIPE_BINARY MODEL_DIR TOKENIZER_DIR
set -euo pipefail
bin=$1 model=$2 tok=$3
source "$(dirname "$0")/two_hosts.sh"

common=(--tokenizer "$tok" --served-model-name m --max-model-len 2048 --block-size 16
        --kv-cache-memory 40000000 --max-num-batched-tokens 64 --max-num-seqs 8 --threads 1)
master_port=$((30000 + $$ % 20000))
tp2=(--tensor-parallel-size 2 --enable-expert-parallel --nnodes 2 --master-addr "$addr_a"
     --master-port "$master_port")
start_pair() {  # port log-suffix
  ip netns exec "$ns_a" "$bin" serve "$model" "${common[@]}" "${tp2[@]}" --node-rank 0 \
    --host 127.0.0.1 --port "$1" > "$work/node0$2.log" 2>&1 &
  node0=$!
  pids+=($node0)
  ip netns exec "$ns_b" "$bin" serve "$model" "${common[@]}" "${tp2[@]}" --node-rank 1 \
    --headless > "$work/node1$2.log" 2>&1 &
  node1=$!
  pids+=($node1)
}

ip netns exec "$ns_a" "$bin" serve "$model" "${common[@]}" --host 127.0.0.1 --port 8201 \
  > "$work/tp1.log" 2>&1 &
pids+=($!)
start_pair 8202 ""
wait_ready 8201
wait_ready 8202

long_prompt=$(seq -s, 1 300 | awk -F, '{for(i=1;i<=NF;i++) printf "%s%d", (i>1?",":""), ($i*37)%500+3}')
prompts=("[5,6,7,8,9,10]" "[400,3,77,12]" "[$long_prompt]")
same_texts 8201 8202 "TP=2 across namespaces differs from TP=1" "${prompts[@]}"
grep -q "tensor-parallel rank 1/2.*collectives over gloo" "$work/node1.log" ||
  { echo "FAIL: rank 1 did not use gloo"; cat "$work/node1.log"; exit 1; }
echo "TP=1 and TP=2 + EP (gloo over $addr_a <-> $addr_b) agree on $(grep -c "" "$work/want.txt") greedy texts"

stop_nodes "${pids[0]}" "$node0" "$node1"

# The rank on the other host dies mid-request.
pids=()
start_pair 8203 b
wait_ready 8203
kill_mid_stream 8203 "$node0" "$node1" "pp-stage.*--tp-rank 1 "
