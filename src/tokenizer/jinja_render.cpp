// Renderer of the Jinja subset. Values are JSON (plus "undefined" and shared namespace
// objects). Output conversions follow @huggingface/jinja, the oracle the tests compare with:
// booleans print as true/false, none as null, floats with a trailing .0 when integral.
// Errors inside rendering travel as a private exception and leave render() as a Status.
// Rendering is bounded (the limits below): a template may come with a request.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>

#include "tokenizer/jinja.h"
#include "tokenizer/jinja_ast.h"

namespace tokenizer::jinja {
namespace {

using nlohmann::json;

struct RenderError {
  std::string message;
};

// What one render may build and run. A template from a request or an unknown checkpoint could
// otherwise grow strings and lists without end, nest values deeper than the recursive printers
// and copies can go, or loop for hours. The prompt itself is bounded far below these.
constexpr size_t kMaxStringBytes = 64 << 20;  // a string value, and the rendered text
constexpr size_t kMaxItems = 1 << 22;         // the items of a list or mapping
constexpr int kMaxValueDepth = 128;           // lists and mappings nested in each other
constexpr int64_t kMaxRange = 100000;         // range()'s items, as Jinja's sandbox allows
constexpr int64_t kMaxIterations = 1000000;   // loop iterations of one render

// Nesting of lists and mappings in v, counted up to limit + 1 (the recursion stops there).
int value_depth(const json& v, int limit) {
  if (!v.is_structured()) return 0;
  if (limit <= 0) return 1;
  int deepest = 0;
  for (const json& c : v) {
    deepest = std::max(deepest, value_depth(c, limit - 1));
    if (deepest >= limit) break;
  }
  return deepest + 1;
}

[[noreturn]] void fail(const Node& n, const std::string& what) {
  throw RenderError{"chat template error at line " + std::to_string(n.line) + ": " + what};
}

struct Value {
  json data;                 // when defined and not a namespace
  std::shared_ptr<json> ns;  // namespace(...) object: shared, mutable
  bool undefined = false;

  static Value undef() {
    Value v;
    v.undefined = true;
    return v;
  }
  static Value of(json j) {
    Value v;
    v.data = std::move(j);
    return v;
  }
  const json& j() const { return ns ? *ns : data; }
};

std::string format_number(const json& v) {
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  const double d = v.get<double>();
  if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 1e16) {
    return std::to_string(static_cast<int64_t>(d)) + ".0";
  }
  std::string s = json(d).dump();
  return s;
}

// JSON with Python's separators (", " and ": "), as tojson prints it.
void append_json_text(const json& v, std::string* out, int indent, int depth) {
  const std::string pad =
      indent > 0 ? "\n" + std::string(static_cast<size_t>(indent) * depth, ' ') : "";
  const std::string child_pad =
      indent > 0 ? "\n" + std::string(static_cast<size_t>(indent) * (depth + 1), ' ') : "";
  const char* item_sep = indent > 0 ? "," : ", ";
  if (v.is_array()) {
    if (v.empty()) {
      *out += "[]";
      return;
    }
    *out += "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) *out += item_sep;
      *out += child_pad;
      append_json_text(v[i], out, indent, depth + 1);
    }
    *out += pad + "]";
  } else if (v.is_object()) {
    if (v.empty()) {
      *out += "{}";
      return;
    }
    *out += "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) *out += item_sep;
      first = false;
      *out +=
          child_pad + json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace) + ": ";
      append_json_text(it.value(), out, indent, depth + 1);
    }
    *out += pad + "}";
  } else if (v.is_number_float()) {
    *out += format_number(v);
  } else {
    *out += v.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

std::string to_string(const Value& v) {
  if (v.undefined) return "";
  const json& j = v.j();
  if (j.is_string()) return j.get<std::string>();
  if (j.is_boolean()) return j.get<bool>() ? "true" : "false";
  if (j.is_null()) return "null";
  if (j.is_number()) return format_number(j);
  std::string s;
  append_json_text(j, &s, 0, 0);
  return s;
}

bool truthy(const Value& v) {
  if (v.undefined) return false;
  if (v.ns) return true;
  const json& j = v.data;
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number()) return j.get<double>() != 0.0;
  if (j.is_string() || j.is_array() || j.is_object()) return !j.empty();
  return true;
}

// Python-style str.split(sep, maxsplit).
json split_string(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit) {
  json parts = json::array();
  if (!sep) {
    size_t i = 0;
    auto space = [](char c) {
      return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
    };
    while (true) {
      while (i < s.size() && space(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        parts.push_back(s.substr(i));
        break;
      }
      size_t e = i;
      while (e < s.size() && !space(s[e])) ++e;
      parts.push_back(s.substr(i, e - i));
      i = e;
    }
    return parts;
  }
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) break;
    size_t pos = s.find(*sep, start);
    if (pos == std::string::npos) break;
    parts.push_back(s.substr(start, pos - start));
    start = pos + sep->size();
  }
  parts.push_back(s.substr(start));
  return parts;
}

std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && chars.find(s[b]) != std::string::npos) ++b;
  if (right)
    while (e > b && chars.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}

const std::string kWhitespace = " \t\n\r\f\v";

class Renderer {
 public:
  explicit Renderer(const json& context) {
    scopes_.emplace_back();
    for (auto it = context.begin(); it != context.end(); ++it)
      scopes_[0][it.key()] = Value::of(it.value());
  }

  void exec(const Node& n, std::string* out) {
    switch (n.kind) {
      case NodeKind::kBlock:
        for (const auto& c : n.children) exec(*c, out);
        return;
      case NodeKind::kText:
        *out += n.text;
        break;
      case NodeKind::kOutput:
        *out += to_string(eval(*n.children[0]));
        break;
      case NodeKind::kIf: {
        const size_t pairs = (n.children.size() - (n.has_else ? 1 : 0)) / 2;
        for (size_t i = 0; i < pairs; ++i) {
          if (truthy(eval(*n.children[2 * i]))) {
            exec(*n.children[2 * i + 1], out);
            return;
          }
        }
        if (n.has_else) exec(*n.children.back(), out);
        return;
      }
      case NodeKind::kFor:
        return exec_for(n, out);
      case NodeKind::kSet: {
        Value v = eval(*n.children[0]);
        if (n.names.size() == 1) {
          scopes_.back()[n.names[0]] = std::move(v);
        } else {
          Value target = lookup(n.names[0]);
          if (!target.ns)
            fail(n, "cannot set attribute '" + n.names[1] + "' of '" + n.names[0] +
                        "': not a namespace");
          (*target.ns)[n.names[1]] = v.undefined ? json() : v.j();
        }
        return;
      }
      default:
        fail(n, "not a statement");
    }
    if (out->size() > kMaxStringBytes)
      fail(n, "rendered text longer than " + std::to_string(kMaxStringBytes) + " bytes");
  }

 private:
  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::undef();
  }

  void count_iteration(const Node& n) {
    if (++iterations_ > kMaxIterations)
      fail(n, "more than " + std::to_string(kMaxIterations) + " loop iterations");
  }

  void exec_for(const Node& n, std::string* out) {
    Value iterable = eval(*n.children[0]);
    std::vector<json> items;
    const json& j = iterable.j();
    if (!iterable.undefined) {
      if (j.is_array()) {
        items.assign(j.begin(), j.end());
      } else if (j.is_object()) {
        for (auto it = j.begin(); it != j.end(); ++it) items.push_back(it.key());
      } else if (j.is_string()) {
        for (char c : j.get<std::string>()) items.push_back(std::string(1, c));
      } else {
        fail(n, "cannot iterate over " + std::string(j.type_name()));
      }
    }
    const Node* filter = n.children[2].get();
    scopes_.emplace_back();
    std::vector<json> selected;
    for (json& item : items) {
      count_iteration(n);
      bind_loop_vars(n, item);
      if (filter == nullptr || truthy(eval(*filter))) selected.push_back(std::move(item));
    }
    const size_t count = selected.size();
    for (size_t i = 0; i < count; ++i) {
      count_iteration(n);
      bind_loop_vars(n, selected[i]);
      json loop = {{"index", i + 1},
                   {"index0", i},
                   {"first", i == 0},
                   {"last", i + 1 == count},
                   {"length", count},
                   {"revindex", count - i},
                   {"revindex0", count - i - 1}};
      loop["previtem"] = i > 0 ? selected[i - 1] : json();
      loop["nextitem"] = i + 1 < count ? selected[i + 1] : json();
      scopes_.back()["loop"] = Value::of(std::move(loop));
      exec(*n.children[1], out);
    }
    scopes_.pop_back();
    if (count == 0 && n.has_else) exec(*n.children[3], out);
  }

  void bind_loop_vars(const Node& n, const json& item) {
    if (n.names.size() == 1) {
      scopes_.back()[n.names[0]] = Value::of(item);
      return;
    }
    if (!item.is_array() || item.size() != n.names.size()) fail(n, "cannot unpack loop item");
    for (size_t k = 0; k < n.names.size(); ++k) scopes_.back()[n.names[k]] = Value::of(item[k]);
  }

  // Every value is checked against the limits as it is made.
  Value eval(const Node& n) {
    Value v = eval_node(n);
    const json& j = v.j();
    if (j.is_string() && j.get_ref<const std::string&>().size() > kMaxStringBytes)
      fail(n, "a string longer than " + std::to_string(kMaxStringBytes) + " bytes");
    if (j.is_structured()) {
      if (j.size() > kMaxItems)
        fail(n, "a list or mapping of more than " + std::to_string(kMaxItems) + " items");
      const bool builds = n.kind == NodeKind::kList || n.kind == NodeKind::kDict ||
                          n.kind == NodeKind::kFilter || n.kind == NodeKind::kCall ||
                          n.kind == NodeKind::kBinary;
      if (builds && value_depth(j, kMaxValueDepth) > kMaxValueDepth)
        fail(n, "values nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
    }
    return v;
  }

  Value eval_node(const Node& n) {
    switch (n.kind) {
      case NodeKind::kLiteral:
        return Value::of(n.value);
      case NodeKind::kName:
        return lookup(n.text);
      case NodeKind::kList: {
        json a = json::array();
        for (const auto& c : n.children) a.push_back(eval(*c).j());
        return Value::of(std::move(a));
      }
      case NodeKind::kDict: {
        json o = json::object();
        for (size_t i = 0; i + 1 < n.children.size(); i += 2) {
          o[to_string(eval(*n.children[i]))] = eval(*n.children[i + 1]).j();
        }
        return Value::of(std::move(o));
      }
      case NodeKind::kGetAttr:
        return get_member(n, eval(*n.children[0]), json(n.text));
      case NodeKind::kGetItem:
        return get_member(n, eval(*n.children[0]), eval(*n.children[1]).j());
      case NodeKind::kSlice:
        return slice(n);
      case NodeKind::kCall:
        return call(n);
      case NodeKind::kFilter:
        return filter(n);
      case NodeKind::kTest: {
        const bool r = test(n);
        return Value::of(n.negated ? !r : r);
      }
      case NodeKind::kUnary: {
        Value v = eval(*n.children[0]);
        if (n.text == "not") return Value::of(!truthy(v));
        if (!v.j().is_number()) fail(n, "unary " + n.text + " needs a number");
        if (n.text == "+") return v;
        if (!v.j().is_number_integer()) return Value::of(-v.j().get<double>());
        const int64_t x = v.j().get<int64_t>();
        if (x == INT64_MIN) fail(n, "integer overflow");
        return Value::of(-x);
      }
      case NodeKind::kTernary: {
        if (truthy(eval(*n.children[1]))) return eval(*n.children[0]);
        return n.children[2] ? eval(*n.children[2]) : Value::undef();
      }
      case NodeKind::kBinary:
        return binary(n);
      default:
        fail(n, "not an expression");
    }
  }

  Value get_member(const Node& n, const Value& obj, const json& key) {
    if (obj.undefined) return Value::undef();
    const json& j = obj.j();
    if (j.is_object() && key.is_string()) {
      auto it = j.find(key.get<std::string>());
      return it == j.end() ? Value::undef() : Value::of(*it);
    }
    if ((j.is_array() || j.is_string()) && key.is_number_integer()) {
      int64_t i = key.get<int64_t>();
      const int64_t size =
          static_cast<int64_t>(j.is_array() ? j.size() : j.get<std::string>().size());
      if (i < 0) i += size;
      if (i < 0 || i >= size) return Value::undef();
      return j.is_array() ? Value::of(j[i]) : Value::of(std::string(1, j.get<std::string>()[i]));
    }
    if (j.is_array() && key == "length") return Value::of(j.size());
    (void)n;
    return Value::undef();
  }

  Value slice(const Node& n) {
    Value obj = eval(*n.children[0]);
    const json& j = obj.j();
    if (!j.is_array() && !j.is_string()) fail(n, "cannot slice " + std::string(j.type_name()));
    const int64_t size =
        static_cast<int64_t>(j.is_array() ? j.size() : j.get<std::string>().size());
    auto bound = [&](const Node* c, int64_t def) {
      if (c == nullptr) return def;
      Value v = eval(*c);
      if (!v.j().is_number_integer()) fail(n, "slice indices must be integers");
      int64_t i = v.j().get<int64_t>();
      if (i < 0) i += size;
      return std::clamp<int64_t>(i, 0, size);
    };
    int64_t step = 1;
    if (n.children[3]) {
      Value s = eval(*n.children[3]);
      if (!s.j().is_number_integer() || s.j().get<int64_t>() == 0)
        fail(n, "slice step must be a non-zero integer");
      step = s.j().get<int64_t>();
    }
    if (step < 0) {
      int64_t start =
          n.children[1] ? std::min(bound(n.children[1].get(), size - 1), size - 1) : size - 1;
      int64_t stop = n.children[2] ? bound(n.children[2].get(), -1) : -1;
      json out = json::array();
      std::string str;
      for (int64_t i = start; i > stop; i += step) {
        if (j.is_array())
          out.push_back(j[i]);
        else
          str += j.get<std::string>()[i];
      }
      return j.is_array() ? Value::of(out) : Value::of(str);
    }
    const int64_t start = bound(n.children[1].get(), 0), stop = bound(n.children[2].get(), size);
    if (j.is_array()) {
      json out = json::array();
      for (int64_t i = start; i < stop; i += step) out.push_back(j[i]);
      return Value::of(std::move(out));
    }
    std::string s;
    for (int64_t i = start; i < stop; i += step) s += j.get<std::string>()[i];
    return Value::of(s);
  }

  struct Args {
    std::vector<Value> positional;
    std::map<std::string, Value> keyword;
  };
  Args eval_args(const Node& n, size_t first) {
    Args a;
    const size_t num_kw = n.kwarg_names.size();
    const size_t num_pos = n.children.size() - first - num_kw;
    for (size_t i = 0; i < num_pos; ++i) a.positional.push_back(eval(*n.children[first + i]));
    for (size_t i = 0; i < num_kw; ++i) {
      a.keyword[n.kwarg_names[i]] = eval(*n.children[first + num_pos + i]);
    }
    return a;
  }
  static const Value* arg(const Args& a, size_t i, const char* name) {
    if (i < a.positional.size()) return &a.positional[i];
    auto it = a.keyword.find(name);
    return it == a.keyword.end() ? nullptr : &it->second;
  }

  Value call(const Node& n) {
    const Node& callee = *n.children[0];
    Args a = eval_args(n, 1);
    if (callee.kind == NodeKind::kName) {
      if (callee.text == "namespace") {
        Value v;
        v.ns = std::make_shared<json>(json::object());
        for (auto& [k, val] : a.keyword) (*v.ns)[k] = val.j();
        return v;
      }
      if (callee.text == "raise_exception") {
        fail(n, a.positional.empty() ? "raise_exception()" : to_string(a.positional[0]));
      }
      if (callee.text == "range") {
        std::vector<int64_t> b;
        for (auto& p : a.positional) {
          if (!p.j().is_number_integer()) fail(n, "range() needs integers");
          b.push_back(p.j().get<int64_t>());
        }
        int64_t start = 0, stop = 0, step = 1;
        if (b.size() == 1)
          stop = b[0];
        else if (b.size() >= 2)
          start = b[0], stop = b[1];
        if (b.size() == 3) step = b[2];
        if (step == 0 || b.empty() || b.size() > 3) fail(n, "bad range() arguments");
        // The item count in unsigned 64 bits: start, stop and step may be anywhere in int64.
        const bool up = step > 0;
        uint64_t size = 0;
        if (up ? start < stop : start > stop) {
          const uint64_t span =
              up ? uint64_t(stop) - uint64_t(start) : uint64_t(start) - uint64_t(stop);
          const uint64_t stride = up ? uint64_t(step) : uint64_t(0) - uint64_t(step);
          size = (span - 1) / stride + 1;
        }
        if (size > uint64_t(kMaxRange))
          fail(n, "range() of more than " + std::to_string(kMaxRange) + " items");
        json out = json::array();
        for (int64_t i = 0; i < static_cast<int64_t>(size); ++i)
          out.push_back(int64_t(uint64_t(start) + uint64_t(i) * uint64_t(step)));  // in range
        return Value::of(std::move(out));
      }
      fail(n, "unknown function '" + callee.text + "'");
    }
    if (callee.kind != NodeKind::kGetAttr) fail(n, "only functions and methods can be called");
    Value obj = eval(*callee.children[0]);
    const std::string& m = callee.text;
    const json& j = obj.j();
    if (!obj.undefined && j.is_string()) {
      const std::string s = j.get<std::string>();
      auto str_arg = [&](size_t i, const char* name) -> std::optional<std::string> {
        const Value* v = arg(a, i, name);
        if (v == nullptr || v->undefined || v->j().is_null()) return std::nullopt;
        if (!v->j().is_string()) fail(n, m + "() argument must be a string");
        return v->j().get<std::string>();
      };
      if (m == "split") {
        const Value* ms = arg(a, 1, "maxsplit");
        const int64_t maxsplit = ms && ms->j().is_number_integer() ? ms->j().get<int64_t>() : -1;
        auto sep = str_arg(0, "sep");
        if (sep && sep->empty()) fail(n, "empty separator");
        return Value::of(split_string(s, sep, maxsplit));
      }
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        const std::string chars = str_arg(0, "chars").value_or(kWhitespace);
        return Value::of(strip_chars(s, chars, m != "rstrip", m != "lstrip"));
      }
      if (m == "startswith" || m == "endswith") {
        auto p = str_arg(0, "prefix");
        if (!p) fail(n, m + "() needs a string");
        const bool r = m == "startswith" ? s.rfind(*p, 0) == 0
                                         : s.size() >= p->size() &&
                                               s.compare(s.size() - p->size(), p->size(), *p) == 0;
        return Value::of(r);
      }
      if (m == "upper" || m == "lower") {
        std::string r = s;
        for (char& c : r)
          c = static_cast<char>(m == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                             : std::tolower(static_cast<unsigned char>(c)));
        return Value::of(r);
      }
      if (m == "replace") {
        auto from = str_arg(0, "old"), to = str_arg(1, "new");
        if (!from || !to) fail(n, "replace() needs two strings");
        std::string r;
        size_t start = 0, pos;
        while (!from->empty() && (pos = s.find(*from, start)) != std::string::npos) {
          r += s.substr(start, pos - start) + *to;
          start = pos + from->size();
        }
        return Value::of(r + s.substr(start));
      }
    }
    if (!obj.undefined && j.is_object()) {
      if (m == "get") {
        const Value* key = arg(a, 0, "key");
        if (key == nullptr || !key->j().is_string()) fail(n, "get() needs a string key");
        auto it = j.find(key->j().get<std::string>());
        if (it != j.end()) return Value::of(*it);
        const Value* def = arg(a, 1, "default");
        return def ? *def : Value::of(nullptr);
      }
      if (m == "items" || m == "keys" || m == "values") {
        json out = json::array();
        for (auto it = j.begin(); it != j.end(); ++it) {
          if (m == "items")
            out.push_back(json::array({it.key(), it.value()}));
          else if (m == "keys")
            out.push_back(it.key());
          else
            out.push_back(it.value());
        }
        return Value::of(std::move(out));
      }
    }
    fail(n, "unknown method '" + m + "' on " +
                (obj.undefined ? std::string("undefined") : std::string(j.type_name())));
  }

  Value filter(const Node& n) {
    Value v = eval(*n.children[0]);
    Args a = eval_args(n, 1);
    const std::string& f = n.text;
    const json& j = v.j();
    if (f == "tojson") {
      const Value* indent = arg(a, 0, "indent");
      std::string s;
      append_json_text(v.undefined ? json() : j, &s,
                       indent && indent->j().is_number_integer()
                           ? static_cast<int>(indent->j().get<int64_t>())
                           : 0,
                       0);
      return Value::of(s);
    }
    if (f == "safe" || f == "e" || f == "escape") return v;  // chat templates render plain text
    if (f == "string") return Value::of(to_string(v));
    if (f == "default" || f == "d") {
      if (!v.undefined) return v;
      const Value* d = arg(a, 0, "default_value");
      return d ? *d : Value::of("");
    }
    if (v.undefined) fail(n, "filter '" + f + "' applied to an undefined value");
    if (f == "length" || f == "count") {
      if (j.is_string()) return Value::of(j.get<std::string>().size());
      if (j.is_array() || j.is_object()) return Value::of(j.size());
      fail(n, "length of " + std::string(j.type_name()));
    }
    if (f == "trim") {
      if (!j.is_string()) fail(n, "trim needs a string");
      return Value::of(strip_chars(j.get<std::string>(), kWhitespace, true, true));
    }
    if (f == "upper" || f == "lower") {
      std::string r = to_string(v);
      for (char& c : r)
        c = static_cast<char>(f == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                           : std::tolower(static_cast<unsigned char>(c)));
      return Value::of(r);
    }
    if (f == "first" || f == "last") {
      if (!j.is_array() || j.empty()) return Value::undef();
      return Value::of(f == "first" ? j.front() : j.back());
    }
    if (f == "join") {
      if (!j.is_array()) fail(n, "join needs a list");
      const Value* sep = arg(a, 0, "d");
      std::string out, s = sep ? to_string(*sep) : "";
      for (size_t i = 0; i < j.size(); ++i) out += (i ? s : "") + to_string(Value::of(j[i]));
      return Value::of(out);
    }
    if (f == "list") {
      if (j.is_array()) return v;
      fail(n, "list of " + std::string(j.type_name()));
    }
    if (f == "items") {
      if (!j.is_object()) fail(n, "items needs a mapping");
      json out = json::array();
      for (auto it = j.begin(); it != j.end(); ++it)
        out.push_back(json::array({it.key(), it.value()}));
      return Value::of(std::move(out));
    }
    if (f == "int") {
      if (j.is_number()) return Value::of(static_cast<int64_t>(j.get<double>()));
      if (j.is_string()) {
        try {
          return Value::of(std::stoll(j.get<std::string>()));
        } catch (...) {
          return Value::of(0);
        }
      }
      return Value::of(0);
    }
    fail(n, "unknown filter '" + f + "'");
  }

  bool test(const Node& n) {
    Value v = eval(*n.children[0]);
    const std::string& t = n.text;
    const json& j = v.j();
    if (t == "defined") return !v.undefined;
    if (t == "undefined") return v.undefined;
    if (v.undefined) return false;
    if (t == "none") return !v.ns && j.is_null();
    if (t == "string") return j.is_string();
    if (t == "number") return j.is_number();
    if (t == "integer") return j.is_number_integer();
    if (t == "float") return j.is_number_float();
    if (t == "boolean") return j.is_boolean();
    if (t == "true") return j.is_boolean() && j.get<bool>();
    if (t == "false") return j.is_boolean() && !j.get<bool>();
    if (t == "mapping") return v.ns || j.is_object();
    if (t == "sequence" || t == "iterable") return j.is_array() || j.is_string() || j.is_object();
    if (t == "equalto" || t == "eq" || t == "sameas") {
      if (n.children.size() < 2) fail(n, "test '" + t + "' needs an argument");
      return j == eval(*n.children[1]).j();
    }
    fail(n, "unknown test '" + t + "'");
  }

  Value binary(const Node& n) {
    const std::string& op = n.text;
    if (op == "and") {
      Value l = eval(*n.children[0]);
      return truthy(l) ? eval(*n.children[1]) : l;
    }
    if (op == "or") {
      Value l = eval(*n.children[0]);
      return truthy(l) ? l : eval(*n.children[1]);
    }
    Value l = eval(*n.children[0]), r = eval(*n.children[1]);
    if (op == "~") return Value::of(to_string(l) + to_string(r));
    if (op == "in" || op == "not in") {
      bool found = false;
      const json& hay = r.j();
      if (r.undefined) {
        found = false;
      } else if (hay.is_string()) {
        if (!l.j().is_string()) fail(n, "'in <string>' requires a string on the left");
        found = hay.get<std::string>().find(l.j().get<std::string>()) != std::string::npos;
      } else if (hay.is_array()) {
        found = std::find(hay.begin(), hay.end(), l.j()) != hay.end();
      } else if (hay.is_object()) {
        found = l.j().is_string() && hay.contains(l.j().get<std::string>());
      } else {
        fail(n, "'in' needs a string, list or mapping on the right");
      }
      return Value::of(op == "in" ? found : !found);
    }
    if (op == "==")
      return Value::of(!l.undefined && !r.undefined ? l.j() == r.j() : l.undefined == r.undefined);
    if (op == "!=")
      return Value::of(
          !(!l.undefined && !r.undefined ? l.j() == r.j() : l.undefined == r.undefined));
    if (l.undefined || r.undefined) fail(n, "cannot apply '" + op + "' to an undefined value");
    const json &a = l.j(), &b = r.j();
    if (op == "+" && (a.is_string() || b.is_string())) {
      if (a.is_null() || b.is_null()) fail(n, "cannot add none to a string");
      return Value::of(to_string(l) + to_string(r));
    }
    if (op == "+" && a.is_array() && b.is_array()) {
      json out = a;
      out.insert(out.end(), b.begin(), b.end());
      return Value::of(std::move(out));
    }
    if (op == "*" && a.is_string() && b.is_number_integer()) {
      const std::string& piece = a.get_ref<const std::string&>();
      const int64_t times = b.get<int64_t>();
      if (times > 0 && !piece.empty() && uint64_t(times) > kMaxStringBytes / piece.size())
        fail(n, "a string longer than " + std::to_string(kMaxStringBytes) + " bytes");
      std::string out;
      for (int64_t i = 0; i < times; ++i) out += piece;
      return Value::of(out);
    }
    if (a.is_string() && b.is_string()) {
      const std::string &x = a.get_ref<const std::string&>(), &y = b.get_ref<const std::string&>();
      if (op == "<") return Value::of(x < y);
      if (op == ">") return Value::of(x > y);
      if (op == "<=") return Value::of(x <= y);
      if (op == ">=") return Value::of(x >= y);
    }
    if (!a.is_number() || !b.is_number()) fail(n, "unsupported operand types for '" + op + "'");
    const bool ints = a.is_number_integer() && b.is_number_integer();
    const double x = a.get<double>(), y = b.get<double>();
    if (op == "<") return Value::of(x < y);
    if (op == ">") return Value::of(x > y);
    if (op == "<=") return Value::of(x <= y);
    if (op == ">=") return Value::of(x >= y);
    if (ints && op != "/") {
      const int64_t p = a.get<int64_t>(), q = b.get<int64_t>();
      int64_t r = 0;
      if ((op == "+" && __builtin_add_overflow(p, q, &r)) ||
          (op == "-" && __builtin_sub_overflow(p, q, &r)) ||
          (op == "*" && __builtin_mul_overflow(p, q, &r)))
        fail(n, "integer overflow");
      if (op == "+" || op == "-" || op == "*") return Value::of(r);
      if (q == 0) fail(n, "division by zero");
      if (op == "%" && q == -1) return Value::of(0);  // INT64_MIN % -1 would trap
      if (op == "//") {                               // floor division, exact in 64 bits
        if (p == INT64_MIN && q == -1) fail(n, "integer overflow");
        const int64_t d = p / q;
        return Value::of(p % q != 0 && (p < 0) != (q < 0) ? d - 1 : d);
      }
      if (op == "%") return Value::of(((p % q) + q) % q);
    }
    if (op == "+") return Value::of(x + y);
    if (op == "-") return Value::of(x - y);
    if (op == "*") return Value::of(x * y);
    if (y == 0) fail(n, "division by zero");
    if (op == "/") return Value::of(x / y);
    if (op == "//") return Value::of(std::floor(x / y));
    if (op == "%") return Value::of(std::fmod(x, y));
    fail(n, "unknown operator '" + op + "'");
  }

  std::vector<std::unordered_map<std::string, Value>> scopes_;
  int64_t iterations_ = 0;  // loop iterations so far (kMaxIterations)
};

}  // namespace

common::Result<std::string> Template::render(const nlohmann::json& context) const {
  if (!context.is_object())
    return common::invalid_argument("chat template context must be an object");
  std::string out;
  try {
    Renderer r(context);
    r.exec(*root_, &out);
  } catch (const RenderError& e) {
    return common::invalid_argument(e.message);
  }
  return out;
}

std::string to_json_text(const nlohmann::json& value) {
  std::string out;
  append_json_text(value, &out, 0, 0);
  return out;
}

}  // namespace tokenizer::jinja
