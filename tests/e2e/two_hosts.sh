# Sourced by the two-host tests: two "hosts" as network namespaces joined by a veth pair
# (iproute2). Sets ns_a/ns_b, addr_a (10.M.0.1) / addr_b (10.M.0.2), work (a temp dir) and
# pids (killed on exit); exits 77 (CTest: skipped) without the rights to make namespaces.
# Also defines wait_ready PORT (a server in namespace A answering /health) and
# texts PORT PROMPT... (one JSON-encoded greedy text of 24 tokens per prompt).
tag="cp$$"
ns_a="${tag}a" ns_b="${tag}b"
net=$((100 + $$ % 150))
addr_a="10.$net.0.1" addr_b="10.$net.0.2"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
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
