// The npm `openai` v6 client against a running chunkpipe server, as users drive it:
// models.list, chat, streamed chat with usage, completions, and a 404 for an unknown model.
//   node tests/e2e/openai_client_test.mjs BASE_URL API_KEY
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "../..");
const require = createRequire(join(root, "tools/npm/package.json"));
const { default: OpenAI } = await import(require.resolve("openai"));

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
let passed = 0, failed = 0;
async function check(name, fn) {
  try {
    await fn();
    ++passed;
    console.log(`ok: ${name}`);
  } catch (e) {
    ++failed;
    console.log(`FAIL: ${name}: ${e?.stack ?? e}`);
  }
}
function assert(cond, what) {
  if (!cond) throw new Error(what);
}

await check("models.list", async () => {
  const page = await client.models.list();
  const ids = page.data.map((m) => m.id);
  assert(ids.includes("deepseek_v3"), `ids: ${ids}`);
});
await check("chat.completions.create", async () => {
  const r = await client.chat.completions.create({
    model: "deepseek_v3",
    messages: [{ role: "system", content: "You are a helpful assistant." }, { role: "user", content: "Hello!" }],
    max_tokens: 5,
  });
  assert(r.object === "chat.completion", r.object);
  assert(typeof r.choices[0].message.content === "string", "content");
  assert(r.usage.completion_tokens <= 5, `usage ${JSON.stringify(r.usage)}`);
});
await check("streamed chat with usage", async () => {
  const stream = await client.chat.completions.create({
    model: "deepseek_v3",
    messages: [{ role: "user", content: "Count to three." }],
    max_tokens: 6,
    stream: true,
    stream_options: { include_usage: true },
    ignore_eos: true,
  });
  let text = "", usage = null, finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert(usage && usage.completion_tokens === 6, `usage ${JSON.stringify(usage)}`);
  assert(finish === "length", `finish ${finish}`);
  assert(typeof text === "string", "text");
});
await check("completions.create", async () => {
  const r = await client.completions.create({ model: "deepseek_v3", prompt: "The future of AI is", max_tokens: 4, temperature: 0 });
  assert(r.object === "text_completion", r.object);
  assert(typeof r.choices[0].text === "string", "text");
});
await check("unknown model is a 404", async () => {
  try {
    await client.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "x" }] });
    throw new Error("no error raised");
  } catch (e) {
    assert(e.status === 404, `status ${e.status}`);
    assert(String(e.error?.message ?? e.message).includes("does not exist"), `message ${e.message}`);
  }
});
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
