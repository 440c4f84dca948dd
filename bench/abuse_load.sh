#!/usr/bin/env bash
# The server under abuse, as figures: serve_load --concurrency 32 alone, then again while
# http_abuser holds IDLE idle keep-alive connections and SLOW slow-reading streams; prints
# both throughputs, their ratio, /health latency under abuse, and the server's RSS before and
# after. Usage: bench/abuse_load.sh [IDLE=2000] [SLOW=500] (run from the repository root,
# after scripts/build.sh). Uses the e2e tests' small random model.
set -euo pipefail
cd "$(dirname "$0")/.."
idle="${1:-2000}"
slow="${2:-500}"
model=/tmp/chunkpipe_abuse_bench_model
port=8391
[ -f "$model/config.json" ] || ./build/chunkpipe make-model "$model" --hidden 64 --layers 2 \
  --heads 2 --q-lora-rank 32 --kv-lora-rank 32 --qk-nope 16 --qk-rope 16 --v-head 16 \
  --experts 8 --top-k 2 --n-group 2 --topk-group 1 --inter 128 --moe-inter 32 --seed 7 >/dev/null
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); flags: $(grep -m1 flags /proc/cpuinfo | grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_0-9]*' | sort -u | xargs); cores: $(nproc)"
./build/chunkpipe serve "$model" --host 127.0.0.1 --port "$port" --served-model-name deepseek_v3 \
  --max-model-len 512 --block-size 16 --kv-cache-memory 64000000 --threads 1 --max-num-seqs 256 \
  --max-num-batched-tokens 2048 --http-keep-alive-timeout 600 >/tmp/chunkpipe_abuse_bench.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
rss() { awk '/VmRSS/ {print $2 / 1024 " MiB"}' "/proc/$pid/status"; }
echo "server RSS at start: $(rss)"
gen_tokens() { curl -s "http://127.0.0.1:$port/metrics" | awk '/^vllm:generation_tokens_total/ {print $2}'; }
load() { ./build/serve_load 127.0.0.1 "$port" --concurrency 32 --requests-per-worker 8 \
  --max-tokens 32 | tail -1; }
./build/serve_load 127.0.0.1 "$port" --concurrency 8 --requests-per-worker 2 >/dev/null  # warm-up
echo "clean run:        $(load)"
clean=$(load); echo "clean run again:  $clean"
# Slow readers take 16 bytes a second of a 16-token stream: each holds its connection and its
# queued output for the whole run, so their engine work is a burst before the measurement.
./build/http_abuser "$port" --idle "$idle" --slow "$slow" --seconds 75 --max-tokens 16 \
  --read-bytes 16 --read-interval-ms 1000 >/tmp/chunkpipe_abuser.out &
abuser=$!
sleep 15
echo "server RSS with $idle idle + $slow slow connections: $(rss)"
g0=$(gen_tokens); abused=$(load); g1=$(gen_tokens); echo "under abuse:      $abused"
echo "engine tokens generated during the abused run: $(python3 -c "print(int($g1 - $g0))") (serve_load asked for 8192)"
wait $abuser
cat /tmp/chunkpipe_abuser.out
sleep 2
echo "server RSS after the abuse: $(rss)"
python3 - "$clean" "$abused" <<'PY'
import sys
c = float(sys.argv[1].split()[3]); a = float(sys.argv[2].split()[3])
print(f"output tokens/s: clean {c:.1f}, under abuse {a:.1f}, ratio {a / c:.3f}")
PY
kill -TERM $pid; wait $pid || true
