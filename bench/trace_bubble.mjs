// Pipeline bubble fraction per prompt from a chunkpipe --trace-file (Chrome trace events).
// Events are split into bursts (one per prompt) wherever every stage was idle for over 100 ms;
// for each burst, bubble = 1 - Σ stage busy time / (stages × burst span).
// usage: node bench/trace_bubble.mjs TRACE.json [LAST_N]   prints one fraction per burst
import { readFileSync } from "node:fs";

const [path, lastArg] = process.argv.slice(2);
const events = JSON.parse(readFileSync(path, "utf8")).traceEvents.filter((e) => e.ph === "X");
events.sort((a, b) => a.ts - b.ts);
const stages = new Set(events.map((e) => e.tid)).size;
const bursts = [];
let current = null;
for (const e of events) {
  if (current === null || e.ts > current.end + 100e3) {
    current = { start: e.ts, end: e.ts + e.dur, busy: 0 };
    bursts.push(current);
  }
  current.end = Math.max(current.end, e.ts + e.dur);
  current.busy += e.dur;
}
const last = Number(lastArg || bursts.length);
const out = bursts.slice(-last).map((b) => (1 - b.busy / (stages * (b.end - b.start))).toFixed(3));
console.log(out.join(" "));
