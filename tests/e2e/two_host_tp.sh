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
texts 8201 "${prompts[@]}" > "$work/tp1.txt"
texts 8202 "${prompts[@]}" > "$work/tp2.txt"
if ! cmp -s "$work/tp1.txt" "$work/tp2.txt"; then
  echo "FAIL: TP=2 across namespaces differs from TP=1"; diff "$work/tp1.txt" "$work/tp2.txt"; exit 1
fi
if grep -q '^""$' "$work/tp2.txt"; then echo "FAIL: an empty text"; cat "$work/tp2.txt"; exit 1; fi
grep -q "tensor-parallel rank 1/2.*collectives over gloo" "$work/node1.log" ||
  { echo "FAIL: rank 1 did not use gloo"; cat "$work/node1.log"; exit 1; }
echo "TP=1 and TP=2 + EP (gloo over $addr_a <-> $addr_b) agree on $(grep -c "" "$work/tp1.txt") greedy texts"

kill -TERM "${pids[0]}"
wait "${pids[0]}" || true
kill -TERM "$node0"
rc0=0; wait "$node0" || rc0=$?
rc1=0; wait "$node1" || rc1=$?
if [[ $rc0 -ne 0 || $rc1 -ne 0 ]]; then
  echo "FAIL: exit codes node0=$rc0 node1=$rc1"; tail -n 8 "$work/node0.log" "$work/node1.log"; exit 1
fi
echo "both nodes exited 0 after SIGTERM on node 0"

# The rank on the other host dies mid-request.
pids=()
start_pair 8203 b
wait_ready 8203
ip netns exec "$ns_a" curl -sN "127.0.0.1:8203/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model":"m","prompt":[5,6,7],"max_tokens":2000,"ignore_eos":true,"stream":true}' \
  > "$work/stream.txt" &
curl_pid=$!
for _ in $(seq 1 100); do [[ $(grep -c '^data:' "$work/stream.txt") -ge 4 ]] && break; sleep 0.05; done
rank1=$(pgrep -f "pp-stage.*--tp-rank 1 " | head -1)
start=$(date +%s%N)
kill -9 "$rank1"
rc0=0; timeout 30 tail --pid="$node0" -f /dev/null || true; wait "$node0" || rc0=$?
rc1=0; wait "$node1" || rc1=$?
wait "$curl_pid" || true
took_ms=$(( ($(date +%s%N) - start) / 1000000 ))
grep -q "EngineDeadError" "$work/stream.txt" || { echo "FAIL: no error event"; tail -c 500 "$work/stream.txt"; exit 1; }
if [[ $rc0 -ne 1 || $rc1 -ne 1 ]]; then
  echo "FAIL: after the remote rank died: node0=$rc0 node1=$rc1 (want 1 and 1)"
  tail -n 8 "$work/node0b.log" "$work/node1b.log"; exit 1
fi
echo "remote TP rank 1 killed mid-stream: error event streamed, node 0 exited $rc0 and node 1 $rc1 after ${took_ms} ms"
grep -h "ERROR" "$work/node0b.log" "$work/node1b.log" | head -4
