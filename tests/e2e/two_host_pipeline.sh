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
texts 8101 "${prompts[@]}" > "$work/pp1.txt"
texts 8102 "${prompts[@]}" > "$work/pp2.txt"
if ! cmp -s "$work/pp1.txt" "$work/pp2.txt"; then
  echo "FAIL: PP=2 across namespaces differs from PP=1"; diff "$work/pp1.txt" "$work/pp2.txt"; exit 1
fi
if grep -q '^""$' "$work/pp2.txt"; then echo "FAIL: an empty text"; cat "$work/pp2.txt"; exit 1; fi
grep -q "Headless node 1 of 2" "$work/node1.log" || { echo "FAIL: node 1 log"; cat "$work/node1.log"; exit 1; }
chunks=$(grep -c "" "$work/pp1.txt")
echo "PP=1 and PP=2 over $addr_a <-> $addr_b agree on $chunks greedy texts (the long prompt: 600 tokens in chunks of 64)"

kill -TERM "${pids[0]}"
wait "${pids[0]}" || true
kill -TERM "$node0"
rc0=0; wait "$node0" || rc0=$?
rc1=0; wait "$node1" || rc1=$?
if [[ $rc0 -ne 0 || $rc1 -ne 0 ]]; then
  echo "FAIL: exit codes node0=$rc0 node1=$rc1"; tail -n 8 "$work/node0.log" "$work/node1.log"; exit 1
fi
echo "both nodes exited 0 after SIGTERM on node 0"

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
ip netns exec "$ns_a" curl -sN "127.0.0.1:8103/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model":"m","prompt":[5,6,7],"max_tokens":2000,"ignore_eos":true,"stream":true}' \
  > "$work/stream.txt" &
curl_pid=$!
for _ in $(seq 1 100); do [[ $(grep -c '^data:' "$work/stream.txt") -ge 4 ]] && break; sleep 0.05; done
stage1=$(pgrep -f -P "$node1" "pp-stage.*--stage 1 " || pgrep -f "pp-stage.*--stage 1 .*tcp-connect" | head -1)
kill -9 "$stage1"
rc0=0; timeout 30 tail --pid="$node0" -f /dev/null || true; wait "$node0" || rc0=$?
rc1=0; wait "$node1" || rc1=$?
wait "$curl_pid" || true
grep -q "EngineDeadError" "$work/stream.txt" || { echo "FAIL: no error event"; tail -c 500 "$work/stream.txt"; exit 1; }
if [[ $rc0 -ne 1 || $rc1 -ne 1 ]]; then
  echo "FAIL: after the remote stage died: node0=$rc0 node1=$rc1 (want 1 and 1)"
  tail -n 8 "$work/node0b.log" "$work/node1b.log"; exit 1
fi
echo "remote stage 1 killed mid-stream: error event streamed, node 0 exited $rc0, node 1 exited $rc1"
grep -h "ERROR" "$work/node0b.log" "$work/node1b.log" | head -4
