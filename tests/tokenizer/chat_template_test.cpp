// Chat templates: the Jinja renderer and the built-in V3.1 template against texts rendered by
// npm @huggingface/jinja (tests/data/chat/expected.json, made by tools/render_chat_fixtures.mjs),
// continue_final_message, the errors bad templates and bad messages produce, and the bounds a
// hostile template meets.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <regex>
#include <sstream>

namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

std::string v3_template() {
  return read_json(CHUNKPIPE_TOKENIZER_CONFIG_JSON)["chat_template"].get<std::string>();
}

class ChatFixtureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(CHUNKPIPE_TEST_DATA_DIR) + "/chat/";
    for (const json& c : read_json(dir + "conversations.json")) conversations_[c["name"]] = c;
    expected_ = read_json(dir + "expected.json");
  }
  tokenizer::ChatRenderOptions options_for(const json& c) {
    tokenizer::ChatRenderOptions o;
    o.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    if (c.contains("chat_template_kwargs")) o.chat_template_kwargs = c["chat_template_kwargs"];
    if (c.contains("tools")) o.tools = c["tools"];
    return o;
  }
  std::map<std::string, json> conversations_;
  json expected_;
};

TEST_F(ChatFixtureTest, JinjaRendererMatchesHuggingfaceJinja) {
  auto v3 = tokenizer::ChatTemplate::create(v3_template());
  auto v31 = tokenizer::ChatTemplate::create(tokenizer::deepseek_v31_template_text());
  ASSERT_TRUE(v3.ok()) << v3.status().message();
  ASSERT_TRUE(v31.ok()) << v31.status().message();
  int checked = 0;
  for (const json& e : expected_) {
    ASSERT_TRUE(e["error"].is_null()) << e.dump();
    const json& c = conversations_.at(e["conversation"].get<std::string>());
    const auto& tmpl = e["template"] == "v3" ? **v3 : **v31;
    auto r = tmpl.render(c["messages"], options_for(c));
    ASSERT_TRUE(r.ok()) << e["conversation"] << ": " << r.status().message();
    EXPECT_EQ(*r, e["rendered"].get<std::string>()) << e["template"] << " " << e["conversation"];
    ++checked;
  }
  std::printf("    %d (conversation, template) renderings identical to @huggingface/jinja\n",
              checked);
  EXPECT_GE(checked, 24);
}

TEST_F(ChatFixtureTest, BuiltinV31MatchesTheJinjaTemplate) {
  auto builtin = tokenizer::ChatTemplate::create("");
  ASSERT_TRUE(builtin.ok());
  EXPECT_TRUE((*builtin)->is_builtin());
  int checked = 0;
  for (const json& e : expected_) {
    if (e["template"] != "v31") continue;
    const json& c = conversations_.at(e["conversation"].get<std::string>());
    auto r = (*builtin)->render(c["messages"], options_for(c));
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(*r, e["rendered"].get<std::string>()) << e["conversation"];
    ++checked;
  }
  EXPECT_GE(checked, 12);
}

std::string syntax_error(const std::string& source) {
  auto t = tokenizer::jinja::Template::parse(source);
  EXPECT_FALSE(t.ok()) << "should not parse: " << source;
  return t.ok() ? "" : t.status().message();
}

TEST(JinjaTest, SyntaxErrorsNameLineAndProblem) {
  EXPECT_EQ(
      syntax_error("a\n{% if x %}b"),
      "chat template syntax error at line 2: unexpected end of template, expected '{% endif %}'");
  EXPECT_EQ(syntax_error("{% frobnicate %}"),
            "chat template syntax error at line 1: unsupported tag 'frobnicate'");
  EXPECT_EQ(syntax_error("x\ny\n{{ 'abc }}"),
            "chat template syntax error at line 3: unterminated string literal");
  EXPECT_EQ(syntax_error("{{ a + }}"),
            "chat template syntax error at line 1: expected an expression");
  EXPECT_EQ(syntax_error("{% endfor %}"),
            "chat template syntax error at line 1: unexpected '{% endfor %}'");
  EXPECT_EQ(syntax_error("{{ a"),
            "chat template syntax error at line 1: unterminated tag, expected '}}'");
  EXPECT_EQ(syntax_error("{% for in x %}{% endfor %}"),
            "chat template syntax error at line 1: expected a loop variable");
}

std::string render(const std::string& source, const json& context = json::object()) {
  auto t = tokenizer::jinja::Template::parse(source);
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok()) return "";
  auto r = (*t)->render(context);
  return r.ok() ? *r : "ERROR: " + r.status().message();
}

TEST(JinjaTest, ExpressionsFiltersAndWhitespaceControl) {
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') | length }}"), "4");
  EXPECT_EQ(render("{{ 'x</think>y</think>z'.split('</think>', 1)[1] }}"), "y</think>z");
  EXPECT_EQ(render("{{ {'b': [1, 2.5, none, true], 'a': 'é'} | tojson }}"),
            "{\"a\": \"é\", \"b\": [1, 2.5, null, true]}");
  EXPECT_EQ(
      render(
          "{% for x in xs %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}",
          {{"xs", {"a", "b", "c"}}}),
      "1a,2b,3c");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i "
                   "%}{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(render("  {%- if true -%}  yes  {%- endif -%}  "), "yes");
  EXPECT_EQ(
      render("{% if a is defined %}A{% elif b is not none %}B{% else %}C{% endif %}", {{"b", 1}}),
      "B");
  EXPECT_EQ(render("{{ 'y' if 'ab' in 'xaby' else 'n' }}{{ (1 + 2) * 3 // 2 }}{{ xs[1:] }}",
                   {{"xs", {1, 2, 3}}}),
            "y4[2, 3]");
  EXPECT_EQ(render("line\n  {% if true %}\nkept\n  {% endif %}\nend\n"), "line\nkept\nend");
  EXPECT_EQ(render("{{ raise_exception('bad role') }}"),
            "ERROR: chat template error at line 1: bad role");
  EXPECT_EQ(
      render("{{ x.get('k', 'd') ~ (x.k2 | default('z')) | upper }}", {{"x", json::object()}}),
      "dZ");
  // Filters bind tighter than `+`, as in vLLM's tool templates ('<sep>' + args|tojson + '<end>').
  EXPECT_EQ(render("{{ '<' + x['a'] | tojson + '>' }}", {{"x", {{"a", "q\"s"}}}}), "<\"q\\\"s\">");
}

// The whitespace rules against the two regular expressions of @huggingface/jinja (the naive
// reference: std::regex recurses per character, fine on these short strings), on random text
// made of the characters the rules look at; and on a run of spaces std::regex overflowed on.
TEST(JinjaTest, BlockWhitespaceMatchesTheRegularExpressions) {
  static const std::regex indent(R"((^|\n)[ \t]*(\{[#%-]))"), newline(R"(([#%-]\})\n)");
  auto reference = [](std::string s) {
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return std::regex_replace(std::regex_replace(s, indent, "$1$2"), newline, "$1");
  };
  std::mt19937 rng(5);
  const std::string alphabet = " \t\n{}%#-a";
  for (int i = 0; i < 20000; ++i) {
    std::string s(std::uniform_int_distribution<int>(0, 24)(rng), ' ');
    for (char& c : s)
      c = alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
    ASSERT_EQ(tokenizer::jinja::strip_block_whitespace(s), reference(s)) << json(s).dump();
  }
  const std::string long_indent = "\n" + std::string(1000000, ' ') + "{% if true %}x{% endif %}";
  EXPECT_EQ(tokenizer::jinja::strip_block_whitespace(long_indent), "\n{% if true %}x{% endif %}");
  EXPECT_EQ(render(long_indent), "\nx");
}

// A template may come with a request (--trust-request-chat-template) or an unknown checkpoint:
// nesting, values, loops and arithmetic are bounded, and each bound is an error that says so,
// where the server used to overflow its stack, exhaust memory, loop for hours or trap.
TEST(JinjaTest, HostileTemplatesMeetBoundsNotCrashes) {
  const std::string deep_parens =
      "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  const std::string deep_ifs = [] {
    std::string t;
    for (int i = 0; i < 50000; ++i) t += "{% if true %}";
    t += "x";
    for (int i = 0; i < 50000; ++i) t += "{% endif %}";
    return t;
  }();
  std::string long_sum = "{{ 1", attributes = "{{ x";
  for (int i = 0; i < 100000; ++i) long_sum += " + 1", attributes += ".a";
  const std::string deep_list = "{{ " + std::string(100000, '[') + std::string(100000, ']') + " }}";
  const std::string minuses = "{{ " + std::string(100000, '-') + "1 }}";
  for (const std::string& t :
       {deep_parens, deep_ifs, long_sum + " }}", attributes + " }}", deep_list, minuses}) {
    EXPECT_NE(syntax_error(t).find("nesting deeper than 200 levels"), std::string::npos)
        << t.substr(0, 40);
  }
  EXPECT_NE(syntax_error("{{ 99999999999999999999 }}").find("out of range"), std::string::npos);
  EXPECT_NE(syntax_error("{{ 1" + std::string(400, '0') + ".5 }}").find("out of range"),
            std::string::npos);

  auto refused = [](const std::string& source, const std::string& why) {
    const std::string r = render(source);
    EXPECT_EQ(r.rfind("ERROR: ", 0), 0u) << source << " rendered " << r.size() << " bytes";
    EXPECT_NE(r.find(why), std::string::npos) << source << ": " << r.substr(0, 200);
  };
  refused("{% for i in range(100000000) %}x{% endfor %}", "range() of more than 100000 items");
  refused("{{ range(-9223372036854775807, 9223372036854775807, 3) | length }}",
          "range() of more than");
  refused("{% for i in range(100000) %}{% for j in range(10) %}{% endfor %}{% endfor %}",
          "more than 1000000 loop iterations");
  refused("{{ 'ab' * 4611686018427387904 }}", "a string longer than");
  refused(
      "{% set s = namespace(t='x') %}{% for i in range(40) %}{% set s.t = s.t ~ s.t %}"
      "{% endfor %}{{ s.t | length }}",
      "a string longer than");
  refused(
      "{% set s = namespace(v=[]) %}{% for i in range(1000) %}{% set s.v = [s.v] %}"
      "{% endfor %}{{ s.v }}",
      "values nested deeper than 128 levels");
  refused("{{ 9223372036854775807 + 1 }}", "integer overflow");
  refused("{{ -9223372036854775807 - 2 }}", "integer overflow");
  refused("{{ 4611686018427387904 * 2 }}", "integer overflow");
  refused("{{ (-9223372036854775807 - 1) // -1 }}", "integer overflow");
  // What stays inside the bounds renders as before.
  EXPECT_EQ(render("{{ (-9223372036854775807 - 1) % -1 }}{{ range(3, -3, -2) | join(',') }}"),
            "03,1,-1");
  EXPECT_EQ(render("{{ -7 // 2 }} {{ 7 // -2 }} {{ -9223372036854775807 // 3 }} {{ 6 // 3 }}"),
            "-4 -4 -3074457345618258603 2");
  EXPECT_EQ(render("{{ range(9223372036854775805, 9223372036854775807) | join(',') }}"),
            "9223372036854775805,9223372036854775806");
  EXPECT_EQ(render("{{ " + std::string(150, '(') + "7" + std::string(150, ')') + " }}"), "7");
}

TEST(ChatMessagesTest, BadMessagesNameTheField) {
  auto err = [](const json& messages) {
    auto r = tokenizer::render_deepseek_v31(messages, {});
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_EQ(err(json::object()), "'messages' must be a list");
  EXPECT_EQ(err(json::parse(R"([{"content": "x"}])")), "messages[0].role must be a string");
  EXPECT_EQ(err(json::parse(R"([{"role": "wizard", "content": "x"}])")),
            "messages[0].role 'wizard' is not one of system, user, assistant, tool");
  EXPECT_EQ(err(json::parse(R"([{"role": "user", "content": [{"type": "image_url"}]}])")),
            "messages[0].content[0] must be a {\"type\": \"text\", \"text\": ...} part");
  EXPECT_EQ(err(json::parse(R"([{"role": "user", "content": 5}])")),
            "messages[0].content must be a string, a list of text parts, or null");
  EXPECT_EQ(err(json::parse(R"([{"role": "user"}])")),
            "messages[0].content is required for role 'user'");
}

// continue_final_message: the rendering ends right after the final message's text, by Hugging
// Face's rule, on the built-in template and on both Jinja templates; a template that trims the
// text's trailing space cuts after the trimmed text; one that changes the text is an error.
TEST(ChatContinueTest, FinalMessageIsLeftOpen) {
  const json messages = json::parse(R"([{"role": "user", "content": "Tell a story"},
      {"role": "assistant", "content": "Once upon a time "}])");
  auto builtin = tokenizer::ChatTemplate::create("");
  auto v3 = tokenizer::ChatTemplate::create(v3_template());
  auto v31 = tokenizer::ChatTemplate::create(tokenizer::deepseek_v31_template_text());
  ASSERT_TRUE(builtin.ok() && v3.ok() && v31.ok());
  for (const auto* t : {builtin->get(), v3->get(), v31->get()}) {
    tokenizer::ChatRenderOptions whole_options;
    whole_options.add_generation_prompt = false;
    tokenizer::ChatRenderOptions open_options = whole_options;
    open_options.continue_final_message = true;
    auto whole = t->render(messages, whole_options);
    auto open = t->render(messages, open_options);
    ASSERT_TRUE(whole.ok() && open.ok()) << open.status().message();
    const std::string tail = "Once upon a time ";
    ASSERT_GT(whole->size(), open->size()) << "the whole rendering closes the turn: " << *whole;
    EXPECT_EQ(*open, whole->substr(0, whole->rfind(tail) + tail.size()));
    EXPECT_EQ(open->substr(open->size() - tail.size()), tail);
  }
  auto trimming = tokenizer::ChatTemplate::create(
      "{% for m in messages %}{{ m['content'] | trim }}<end>{% endfor %}");
  auto changing = tokenizer::ChatTemplate::create(
      "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}");
  ASSERT_TRUE(trimming.ok() && changing.ok());
  tokenizer::ChatRenderOptions o;
  o.continue_final_message = true;
  auto trimmed = (*trimming)->render(messages, o);
  ASSERT_TRUE(trimmed.ok()) << trimmed.status().message();
  EXPECT_EQ(*trimmed, "Tell a story<end>Once upon a time");
  auto changed = (*changing)->render(messages, o);
  ASSERT_FALSE(changed.ok());
  EXPECT_NE(changed.status().message().find("does not appear in the rendered chat"),
            std::string::npos);
}

}  // namespace
