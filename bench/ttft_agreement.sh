#!/usr/bin/env bash
# Checks that `chunkpipe bench serve` measures what the server measures: runs 24 requests at
# concurrency 6 against `chunkpipe serve --enable-log-requests` and compares the medians of
# TTFT and E2E latency with the server's per-request log lines. Exits 1 if either differs by
# more than 5 ms (run it on a quiet machine).
#   bench/ttft_agreement.sh [MODEL_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-/tmp/chunkpipe_agreement_model}
[ -f "$model/config.json" ] || ./build/chunkpipe make-model "$model" --hidden 64 --layers 2 --heads 2 \
  --q-lora-rank 32 --kv-lora-rank 32 --qk-nope 16 --qk-rope 16 --v-head 16 --experts 8 --top-k 2 \
  --n-group 2 --topk-group 1 --inter 128 --moe-inter 32 >/dev/null
port=$((20000 + RANDOM % 20000))
log=$(mktemp)
./build/chunkpipe serve "$model" --host 127.0.0.1 --port "$port" --served-model-name m --max-model-len 512 \
  --block-size 16 --kv-cache-memory 16000000 --enable-log-requests > "$log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do curl -s "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
result=$(mktemp -d)
./build/chunkpipe bench serve --port "$port" --model m --random-input-len 48 --random-output-len 8 \
  --num-prompts 24 --max-concurrency 6 --ignore-eos --percentile-metrics ttft,e2el --save-result \
  --result-dir "$result" --result-filename r.json --request-id-prefix agree >/dev/null
kill -TERM "$pid"; wait "$pid" || true
/usr/bin/env python3 - "$result/r.json" "$log" <<'PY'
import json, re, statistics, sys
r = json.load(open(sys.argv[1]))
ttft, e2e = [], []
for line in open(sys.argv[2]):
    if "Finished request cmpl-agree-" in line:
        ttft.append(float(re.search(r"ttft_ms=([0-9.]+)", line).group(1)))
        e2e.append(float(re.search(r"e2e_ms=([0-9.]+)", line).group(1)))
st, se = statistics.median(ttft), statistics.median(e2e)
ct, ce = r["median_ttft_ms"], r["median_e2el_ms"]
print(f"median TTFT: client {ct:.2f} ms, server {st:.2f} ms, difference {ct - st:.2f} ms")
print(f"median E2E:  client {ce:.2f} ms, server {se:.2f} ms, difference {ce - se:.2f} ms")
ok = abs(ct - st) <= 5 and abs(ce - se) <= 5
print("agreement within 5 ms" if ok else "DISAGREEMENT above 5 ms")
sys.exit(0 if ok else 1)
PY
