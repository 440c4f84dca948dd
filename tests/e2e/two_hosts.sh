# Sourced by the two-host tests: two "hosts" as network namespaces joined by a veth pair
# (iproute2). Sets ns_a/ns_b, addr_a (10.M.0.1) / addr_b (10.M.0.2), work (a temp dir) and
# pids (killed on exit); exits 77 (CTest: skipped) without the rights to make namespaces.
# Also defines wait_ready PORT (a server in namespace A answering /health),
# texts PORT PROMPT... (one JSON-encoded greedy text of 24 tokens per prompt),
# same_texts WANT_PORT GOT_PORT WHAT PROMPT... (both servers' texts equal and none empty),
# stop_nodes REF NODE0 NODE1 (SIGTERM to the reference and node 0; both nodes must exit 0) and
# kill_mid_stream PORT NODE0 NODE1 PGREP_PATTERN (a stream on PORT, then SIGKILL of node 1's
# child matching the pattern: the stream must end with an EngineDeadError and both nodes exit
# 1; prints how long that took).
tag="cp$$"
ns_a="${tag}a" ns_b="${tag}b"
net=$((100 + $$ % 150))
addr_a="10.$net.0.1" addr_b="10.$net.0.2"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  # Whatever still runs inside the namespaces ($! may be a subshell's pid) goes too.
  for ns in "$ns_a" "$ns_b"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

make_hosts() {
  ip netns add "$ns_a" && ip netns add "$ns_b" &&
    ip link add "${tag}va" type veth peer name "${tag}vb" &&
    ip link set "${tag}va" netns "$ns_a" && ip link set "${tag}vb" netns "$ns_b" &&
    ip -n "$ns_a" addr add "$addr_a/24" dev "${tag}va" &&
    ip -n "$ns_b" addr add "$addr_b/24" dev "${tag}vb" &&
    ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up &&
    ip -n "$ns_a" link set "${tag}va" up && ip -n "$ns_b" link set "${tag}vb" up &&
    ip netns exec "$ns_a" true
}
if ! command -v ip >/dev/null || ! make_hosts 2>/dev/null; then
  echo "SKIP: cannot create network namespaces joined by veth here (needs root and iproute2)"
  exit 77
fi

wait_ready() {
  for _ in $(seq 1 300); do
    if ip netns exec "$ns_a" curl -sf "127.0.0.1:$1/health" >/dev/null; then return 0; fi
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || break 2; done
    sleep 0.1
  done
  echo "FAIL: server on port $1 did not become ready"; cat "$work"/*.log; exit 1
}

texts() {
  local port=$1
  shift
  for p in "$@"; do
    ip netns exec "$ns_a" curl -sf "127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"model\":\"m\",\"prompt\":$p,\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true}" |
      node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.stringify(JSON.parse(s).choices[0].text)))'
  done
}

same_texts() {
  local want=$1 got=$2 what=$3
  shift 3
  texts "$want" "$@" > "$work/want.txt"
  texts "$got" "$@" > "$work/got.txt"
  if ! cmp -s "$work/want.txt" "$work/got.txt"; then
    echo "FAIL: $what"; diff "$work/want.txt" "$work/got.txt"; exit 1
  fi
  if grep -q '^""$' "$work/got.txt"; then echo "FAIL: an empty text"; cat "$work/got.txt"; exit 1; fi
}

stop_nodes() {
  kill -TERM "$1"
  wait "$1" || true
  kill -TERM "$2"
  local rc0=0 rc1=0
  wait "$2" || rc0=$?
  wait "$3" || rc1=$?
  if [[ $rc0 -ne 0 || $rc1 -ne 0 ]]; then
    echo "FAIL: exit codes node0=$rc0 node1=$rc1"; tail -n 8 "$work"/node*.log; exit 1
  fi
  echo "both nodes exited 0 after SIGTERM on node 0"
}

kill_mid_stream() {
  local port=$1 node0=$2 node1=$3 pattern=$4
  ip netns exec "$ns_a" curl -sN "127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"m","prompt":[5,6,7],"max_tokens":2000,"ignore_eos":true,"stream":true}' \
    > "$work/stream.txt" &
  local curl_pid=$!
  for _ in $(seq 1 100); do [[ $(grep -c '^data:' "$work/stream.txt") -ge 4 ]] && break; sleep 0.05; done
  local victim
  victim=$(pgrep -f -P "$node1" "$pattern" | head -1)  # node 1's own child, never another test's
  local start
  start=$(date +%s%N)
  kill -9 "$victim"
  local rc0=0 rc1=0
  # Bounded: a node that does not exit is a failure, not a hang of the test.
  for node in "$node0" "$node1"; do
    timeout 30 tail --pid="$node" -f /dev/null || true
    if kill -0 "$node" 2>/dev/null; then
      echo "FAIL: a node (pid $node) still runs 30 s after its peer rank was killed"
      tail -n 20 "$work"/node*.log; exit 1
    fi
  done
  wait "$node0" || rc0=$?
  wait "$node1" || rc1=$?
  wait "$curl_pid" || true
  local took_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  grep -q "EngineDeadError" "$work/stream.txt" || { echo "FAIL: no error event"; tail -c 500 "$work/stream.txt"; exit 1; }
  if [[ $rc0 -ne 1 || $rc1 -ne 1 ]]; then
    echo "FAIL: after the remote rank died: node0=$rc0 node1=$rc1 (want 1 and 1)"
    tail -n 8 "$work"/node*.log; exit 1
  fi
  echo "killed '$pattern' mid-stream: error event streamed, node 0 exited $rc0 and node 1 $rc1 after ${took_ms} ms"
  grep -h "ERROR" "$work"/node0*.log "$work"/node1*.log | tail -4
}
