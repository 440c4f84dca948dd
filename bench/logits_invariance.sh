#!/usr/bin/env bash
# Whether `chunkpipe logits --all` depends on the thread count or the chunking: for threads 1, 2
# and 3 and chunks whole / 64 / 100, the largest |logit difference| at any position against one
# thread at the same chunking (must be 0) and against one thread whole (the chunking's own
# effect), with the number of positions that differ. Prints the CPU line first.
#   bench/logits_invariance.sh [ISA=native|avx2|avx512] [DTYPE=bfloat16|float32] [IDS=300]
# A random-weight model (make-model defaults, vocab 2000) is made once under build/.
set -euo pipefail
cd "$(dirname "$0")/.."
isa=${1:-native}
dtype=${2:-bfloat16}
count=${3:-300}
bin=./build/chunkpipe
[ -x "$bin" ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
model=build/logits_invariance_model
[ -f "$model/config.json" ] || "$bin" make-model "$model" --no-tokenizer --vocab 2000 --seed 5 >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ids=$(node -e "let s=1;const a=[];for(let i=0;i<$count;i++){s=(s*1103515245+12345)%2147483648;a.push(s%2000)}console.log(a.join(','))")
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); flags: $(grep -m1 -o -w -E 'avx2|avx512[a-z0-9_]*|amx[a-z0-9_]*|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "CHUNKPIPE_ISA=$isa --dtype $dtype, $count ids, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
for t in 1 2 3; do
  for c in 0 64 100; do
    CHUNKPIPE_ISA=$isa "$bin" logits "$model" --ids "$ids" --all --threads "$t" --chunk "$c" \
      --dtype "$dtype" --out "$out/t${t}_c${c}.json" >/dev/null 2>&1
  done
done
node - "$out" <<'EOF'
const fs = require('fs');
const dir = process.argv[2];
const load = (t, c) => JSON.parse(fs.readFileSync(`${dir}/t${t}_c${c}.json`)).all_logits;
const diff = (a, b) => {
  let worst = 0, rows = 0;
  a.forEach((row, i) => {
    let r = 0;
    row.forEach((v, j) => { r = Math.max(r, Math.abs(v - b[i][j])); });
    worst = Math.max(worst, r);
    if (r > 0) rows++;
  });
  return [worst, rows];
};
const whole = load(1, 0);
for (const c of [0, 64, 100]) {
  const one = load(1, c);
  for (const t of [1, 2, 3]) {
    const got = load(t, c);
    const [same] = diff(got, one);
    const [w, rows] = diff(got, whole);
    const chunk = c === 0 ? 'whole' : `chunks of ${c}`;
    console.log(`threads ${t}, ${chunk}: vs 1 thread same chunking ${same.toExponential(2)}; ` +
                `vs 1 thread whole ${w.toExponential(2)} at ${rows} positions`);
  }
}
EOF
