#!/usr/bin/env bash
# The main job: installs what chunkpipe needs, builds it, makes the default model (a small
# random-weight DeepSeek-V3 with the real tokenizer) once, and serves it on 127.0.0.1:8015 as
# the seed documents' `vllm serve` does. Extra arguments go to `chunkpipe serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
if [ ! -f models/default/config.json ]; then
  ./build/chunkpipe make-model models/default
fi
exec ./build/chunkpipe serve models/default --host 127.0.0.1 --port 8015 \
  --served-model-name deepseek_v3 --max-model-len 8192 --max-num-seqs 64 \
  --max-num-batched-tokens 2048 --kv-cache-memory 1073741824 "$@"
