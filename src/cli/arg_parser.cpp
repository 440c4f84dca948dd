// ArgParser implementation.
#include "cli/arg_parser.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>

namespace cli {
namespace {

std::string normalize(std::string s) {
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

// argparse's test for an argument that cannot be an option's value: it starts with '-', is
// more than "-", is not a negative number, and has no space.
bool looks_like_option(const std::string& arg) {
  if (arg.size() < 2 || arg[0] != '-' || arg.find(' ') != std::string::npos) return false;
  double number = 0;
  const char* end = arg.data() + arg.size();
  const auto [ptr, ec] = std::from_chars(arg.data(), end, number);
  return ec != std::errc() || ptr != end;
}

}  // namespace

void ArgParser::add_positional(const std::string& name, const std::string& help) {
  positional_specs_.emplace_back(name, help);
}

void ArgParser::add_option(const std::string& name, const std::string& help,
                           std::optional<std::string> default_value) {
  specs_.push_back({name, help, false, std::move(default_value)});
}

void ArgParser::add_multi_option(const std::string& name, const std::string& help) {
  specs_.push_back({name, help, false, std::nullopt, true});
}

void ArgParser::add_alias(const std::string& alias, const std::string& name) {
  aliases_[alias] = name;
}

void ArgParser::add_flag(const std::string& name, const std::string& help) {
  specs_.push_back({name, help, true, std::nullopt});
}

common::Result<const ArgParser::Spec*> ArgParser::resolve(const std::string& given) const {
  const std::string key = normalize(given);
  std::vector<const Spec*> matches;
  for (const Spec& s : specs_) {
    if (s.name == key) return &s;
    if (s.name.rfind(key, 0) == 0) matches.push_back(&s);
  }
  if (matches.size() == 1) return matches[0];
  if (matches.empty()) return common::invalid_argument("unrecognized argument: --" + given);
  std::string names;
  for (const Spec* s : matches) names += (names.empty() ? "--" : ", --") + s->name;
  return common::invalid_argument("ambiguous option: --" + given + " could match " + names);
}

common::Status ArgParser::parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      return {};
    }
    std::string body;
    std::optional<std::string> inline_value;
    if (arg.size() > 1 && arg[0] == '-' && arg[1] != '-' &&
        !std::isdigit(static_cast<unsigned char>(arg[1]))) {
      // Short alias: exact ("-tp"), with "=" ("-tp=2"), or with the value attached ("-O3").
      std::string key = arg, attached;
      if (auto eq = arg.find('='); eq != std::string::npos) {
        key = arg.substr(0, eq);
        attached = arg.substr(eq + 1);
      }
      auto it = aliases_.find(key);
      while (it == aliases_.end() && key.size() > 2) {
        attached = key.back() + attached;
        key.pop_back();
        it = aliases_.find(key);
      }
      if (it == aliases_.end()) return common::invalid_argument("unrecognized arguments: " + arg);
      body = it->second;
      if (!attached.empty() || arg.find('=') != std::string::npos) inline_value = attached;
    } else if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      positionals_.push_back(arg);
      continue;
    } else {
      body = arg.substr(2);
      if (auto eq = body.find('='); eq != std::string::npos) {
        inline_value = body.substr(eq + 1);
        body = body.substr(0, eq);
      }
    }
    auto spec = resolve(body);
    if (!spec.ok() && normalize(body).rfind("no-", 0) == 0) {
      auto negated = resolve(normalize(body).substr(3));
      if (negated.ok() && negated.value()->is_flag) {
        values_[negated.value()->name] = "false";
        continue;
      }
    }
    if (!spec.ok()) return spec.status();
    const Spec* s = spec.value();
    if (s->is_flag) {
      if (inline_value)
        return common::invalid_argument("argument --" + s->name + ": takes no value");
      values_[s->name] = "true";
    } else if (inline_value) {
      values_[s->name] = *inline_value;
    } else if (s->multi) {
      std::string joined;
      while (i + 1 < argc && !looks_like_option(argv[i + 1]))
        joined += (joined.empty() ? "" : "\n") + std::string(argv[++i]);
      if (joined.empty())
        return common::invalid_argument("argument --" + s->name +
                                        ": expected at least one argument");
      values_[s->name] = joined;
    } else {
      if (i + 1 >= argc || looks_like_option(argv[i + 1]))
        return common::invalid_argument("argument --" + s->name + ": expected one argument");
      values_[s->name] = argv[++i];
    }
  }
  if (positionals_.size() > positional_specs_.size()) {
    return common::invalid_argument("unrecognized arguments: " +
                                    positionals_[positional_specs_.size()]);
  }
  if (positionals_.size() < positional_specs_.size()) {
    return common::invalid_argument("the following arguments are required: " +
                                    positional_specs_[positionals_.size()].first);
  }
  return {};
}

std::string ArgParser::usage() const {
  std::string u = "usage: " + program_;
  for (const auto& [name, help] : positional_specs_) u += " " + name;
  u += " [options]\n\n" + description_ + "\n\n";
  for (const auto& [name, help] : positional_specs_) u += "  " + name + "\n      " + help + "\n";
  for (const Spec& s : specs_) {
    u += "  --" + s.name + (s.is_flag ? "" : " VALUE") + "\n      " + s.help;
    if (s.default_value) u += " (default: " + *s.default_value + ")";
    u += "\n";
  }
  return u;
}

std::string ArgParser::positional(const std::string& name) const {
  for (size_t i = 0; i < positional_specs_.size(); ++i) {
    if (positional_specs_[i].first == name)
      return i < positionals_.size() ? positionals_[i] : std::string();
  }
  return {};
}

std::optional<std::string> ArgParser::option(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end()) return it->second;
  for (const Spec& s : specs_) {
    if (s.name == name) return s.default_value;
  }
  return std::nullopt;
}

namespace {

// All of `text` as a T (from_chars: no locale, no leading space, nothing left over).
template <typename T>
common::Result<T> parse_whole(const std::string& flag, const std::string& text, const char* kind) {
  T out{};
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return common::invalid_argument("argument --" + flag + ": invalid " + kind + " value: '" +
                                    text + "'");
  }
  return out;
}

}  // namespace

common::Result<int64_t> parse_int_value(const std::string& flag, const std::string& text) {
  return parse_whole<int64_t>(flag, text, "int");
}

common::Result<double> parse_float_value(const std::string& flag, const std::string& text) {
  return parse_whole<double>(flag, text, "float");
}

common::Result<int64_t> ArgParser::int_option(const std::string& name, int64_t min_value,
                                              int64_t max_value) const {
  const std::string v = option(name).value_or("");
  CP_ASSIGN_OR_RETURN(const int64_t out, parse_int_value(name, v));
  if (out < min_value) {
    return common::invalid_argument("argument --" + name + ": must be at least " +
                                    std::to_string(min_value) + ", got " + v);
  }
  if (out > max_value) {
    return common::invalid_argument("argument --" + name + ": must be at most " +
                                    std::to_string(max_value) + ", got " + v);
  }
  return out;
}

common::Result<std::string> ArgParser::choice_option(
    const std::string& name, const std::vector<std::string>& choices) const {
  const std::string v = option(name).value_or("");
  if (std::find(choices.begin(), choices.end(), v) != choices.end()) return v;
  std::string listed;
  for (const std::string& c : choices) listed += (listed.empty() ? "'" : ", '") + c + "'";
  return common::invalid_argument("argument --" + name + ": invalid choice: '" + v +
                                  "' (choose from " + listed + ")");
}

common::Result<double> ArgParser::double_option(const std::string& name, double min_value) const {
  const std::string v = option(name).value_or("");
  CP_ASSIGN_OR_RETURN(const double out, parse_float_value(name, v));
  if (!(out >= min_value)) {
    return common::invalid_argument("argument --" + name + ": must be at least " +
                                    std::to_string(min_value) + ", got " + v);
  }
  return out;
}

int ArgParser::fail(const common::Status& status, int code) const {
  std::fprintf(stderr, "%s%s: error: %s\n", code == 2 ? (usage() + "\n").c_str() : "",
               program_.c_str(), status.message().c_str());
  return code;
}

std::optional<int> ArgParser::parse_or_exit(int argc, char** argv, int first) {
  if (auto st = parse(argc, argv, first); !st.ok()) return fail(st, 2);
  if (help_requested()) {
    std::printf("%s", usage().c_str());
    return 0;
  }
  return std::nullopt;
}

bool ArgParser::flag(const std::string& name) const {
  auto it = values_.find(name);
  return it != values_.end() && it->second == "true";
}

}  // namespace cli
