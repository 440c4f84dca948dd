#!/usr/bin/env bash
# The native / AVX2 kernel table of docs/FIGURES.md for this CPU kind: chunkpipe_bench's
# `small` model (perf-targets.md dims) with BF16 and W8A8 weights, on the native kernel paths
# and on the AVX2 baseline (CHUNKPIPE_ISA=avx2), rounds interleaved so that the configurations
# share the machine's state.
# Prints the CPU line, the roofs, and per configuration prefill pp512, decode tg128 and prefill
# of 4096 tokens with their percentages of the roofs; then per ISA path the decode attention
# alone after 4096 and 16384 tokens (ms and % of the FMA peak).
#   bench/kernel_figures.sh [ROUNDS=2] [THREADS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
threads=${2:-2}
bench=./build/chunkpipe_bench
[ -x "$bench" ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
configs=("native bf16" "native w8a8" "avx2 bf16" "avx2 w8a8")
for round in $(seq 1 "$rounds"); do
  for c in "${configs[@]}"; do
    set -- $c
    echo "== round $round: CHUNKPIPE_ISA=$1 --dtype $2"
    CHUNKPIPE_ISA=$1 "$bench" --threads "$threads" --model small --dtype "$2" --skip-gemm \
      --long-prefill 4096 | grep -E '^cpu:|^kernel paths|^threads|^per token|^[0-9]+ '
  done
done
for round in $(seq 1 "$rounds"); do
  for isa in native avx2; do
    echo "== round $round: CHUNKPIPE_ISA=$isa decode attention"
    CHUNKPIPE_ISA=$isa "$bench" --threads "$threads" --model small --skip-gemm --skip-model \
      --decode-attention 4096,16384 | grep -E '^kernel paths|^ +[0-9]+ +[0-9]+ \|'
  done
done
