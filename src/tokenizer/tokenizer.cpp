// tokenizer.json loading and the encode / decode pipelines.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/byte_level.h"

namespace tokenizer {
namespace {

using common::Result;
using common::Status;
using nlohmann::json;

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return common::not_found(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Optional token in tokenizer_config.json: a string or {"content": ...}.
std::string config_token(const json& config, const char* key) {
  if (!config.contains(key)) return "";
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json(const std::string& json_text,
                                                        const std::string& source) {
  // tokenizer.json comes with a checkpoint: a field of an unexpected type is a bad file.
  try {
    return parse_tokenizer_json(json_text, source);
  } catch (const json::exception& e) {
    std::string what = e.what();
    const size_t cut = what.find("] ");
    return common::invalid_argument(source + ": " +
                                    (cut == std::string::npos ? what : what.substr(cut + 2)));
  }
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::parse_tokenizer_json(const std::string& json_text,
                                                                   const std::string& source) {
  json root = json::parse(json_text, nullptr, false);
  if (root.is_discarded() || !root.is_object()) {
    return common::invalid_argument(source + ": not a JSON object");
  }
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  auto bad = [&](const std::string& what) {
    return common::invalid_argument(source + ": " + what);
  };

  // model
  if (!root.contains("model") || !root["model"].is_object()) return bad("missing 'model'");
  const json& model = root["model"];
  const std::string model_type = model.value("type", "BPE");
  if (model_type != "BPE")
    return bad("model type '" + model_type + "' is not supported (only BPE)");
  if (model.value("byte_fallback", false)) return bad("model.byte_fallback=true is not supported");
  if (!model.contains("vocab") || !model["vocab"].is_object()) return bad("missing 'model.vocab'");
  if (!model.contains("merges") || !model["merges"].is_array())
    return bad("missing 'model.merges'");
  std::unordered_map<std::string, int32_t> vocab;
  int32_t max_id = -1;
  // Ids index per-token tables: bound them (the largest real vocabularies are ~260k).
  constexpr int64_t kMaxTokenId = 1 << 24;
  auto valid_id = [](const json& v) {
    return v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > kMaxTokenId) &&
           v.get<int64_t>() >= 0 && v.get<int64_t>() < kMaxTokenId;
  };
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!valid_id(it.value())) {
      return bad("model.vocab entry '" + it.key() + "' has no valid id");
    }
    const int32_t id = it.value().get<int32_t>();
    vocab.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(model["merges"].size());
  for (const json& m : model["merges"]) {
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) return bad("merge '" + s + "' is not two tokens");
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return bad("model.merges holds an entry that is neither \"a b\" nor [a, b]");
    }
  }

  // added tokens
  if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
    for (const json& a : root["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a.contains("content") || !valid_id(a["id"]) ||
          !a["content"].is_string()) {
        return bad("added_tokens holds an entry without a valid integer 'id' and string 'content'");
      }
      AddedToken tok{a["id"].get<int32_t>(), a["content"].get<std::string>(),
                     a.value("special", false)};
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        if (a.value(flag, false)) {
          return bad("added token '" + tok.content + "' sets " + flag + ", which is not supported");
        }
      }
      if (tok.content.empty()) return bad("added token " + std::to_string(tok.id) + " is empty");
      max_id = std::max(max_id, tok.id);
      t->added_.push_back(std::move(tok));
    }
  }

  // normalizer
  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    const json& n = root["normalizer"];
    const std::string type = n.value("type", "");
    const bool empty_sequence =
        type == "Sequence" && n.contains("normalizers") && n["normalizers"].empty();
    if (!empty_sequence) return bad("normalizer type '" + type + "' is not supported");
  }

  // pre-tokenizer: Split steps, then ByteLevel (its own regex when use_regex).
  if (root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null()) {
    const json& p = root["pre_tokenizer"];
    std::vector<json> steps;
    if (p.value("type", "") == "Sequence") {
      for (const json& s : p.value("pretokenizers", json::array())) steps.push_back(s);
    } else {
      steps.push_back(p);
    }
    for (const json& s : steps) {
      const std::string type = s.value("type", "");
      if (type == "Split") {
        if (s.value("invert", false))
          return bad("pre-tokenizer Split with invert=true is not supported");
        const std::string behavior = s.value("behavior", "Isolated");
        SplitBehavior b;
        if (behavior == "Isolated") {
          b = SplitBehavior::kIsolated;
        } else if (behavior == "Removed") {
          b = SplitBehavior::kRemoved;
        } else {
          return bad("pre-tokenizer Split behavior '" + behavior + "' is not supported");
        }
        const json pattern = s.value("pattern", json::object());
        const bool literal = pattern.contains("String");
        const json& pat = literal ? pattern["String"] : pattern.value("Regex", json());
        if (!pat.is_string()) return bad("pre-tokenizer Split has no pattern");
        auto split = RegexSplit::create(pat.get<std::string>(), literal, b);
        if (!split.ok()) return bad(split.status().message());
        t->splits_.push_back(std::move(split).value());
      } else if (type == "ByteLevel") {
        if (s.value("add_prefix_space", false)) {
          return bad("pre-tokenizer ByteLevel add_prefix_space=true is not supported");
        }
        if (s.value("use_regex", true)) {  // GPT-2's own split
          auto split = RegexSplit::create(
              R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
              false, SplitBehavior::kIsolated);
          if (!split.ok()) return bad(split.status().message());
          t->splits_.push_back(std::move(split).value());
        }
      } else {
        return bad("pre-tokenizer type '" + type + "' is not supported");
      }
    }
  }

  // decoder
  if (root.contains("decoder") && !root["decoder"].is_null()) {
    const std::string type = root["decoder"].value("type", "");
    if (type != "ByteLevel") return bad("decoder type '" + type + "' is not supported");
  }

  auto bpe = BpeModel::create(std::move(vocab), merges);
  if (!bpe.ok()) return bpe.status();
  t->bpe_.emplace(std::move(bpe).value());

  t->token_bytes_.assign(max_id + 1, std::string());
  t->special_.assign(max_id + 1, false);
  t->is_added_.assign(max_id + 1, false);
  for (const auto& [text, id] : t->bpe_->vocab()) {
    auto bytes = byte_level_to_bytes(text);
    t->token_bytes_[id] = bytes ? *bytes : text;  // non-byte-level entries decode verbatim
  }
  t->trie_children_.emplace_back();
  t->trie_token_.push_back(-1);
  for (const AddedToken& a : t->added_) {
    t->token_bytes_[a.id] = a.content;
    t->special_[a.id] = a.special;
    t->is_added_[a.id] = true;
    int node = 0;
    for (unsigned char c : a.content) {
      auto& kids = t->trie_children_[node];
      auto it = std::find_if(kids.begin(), kids.end(), [c](auto& p) { return p.first == c; });
      if (it == kids.end()) {
        const int child = static_cast<int>(t->trie_children_.size());
        kids.emplace_back(c, child);
        t->trie_children_.emplace_back();
        t->trie_token_.push_back(-1);
        node = child;
      } else {
        node = it->second;
      }
    }
    t->trie_token_[node] = a.id;
  }
  for (const std::string& b : t->token_bytes_)
    t->max_token_bytes_ = std::max(t->max_token_bytes_, b.size());
  return t;
}

Status Tokenizer::load_config(const std::string& json_text, const std::string& source) {
  json c = json::parse(json_text, nullptr, false);
  if (c.is_discarded() || !c.is_object())
    return common::invalid_argument(source + ": not a JSON object");
  bos_token_ = config_token(c, "bos_token");
  eos_token_ = config_token(c, "eos_token");
  if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) {
    add_bos_token_ = c["add_bos_token"].get<bool>();
  }
  if (c.contains("chat_template") && c["chat_template"].is_string()) {
    chat_template_ = c["chat_template"].get<std::string>();
  }
  if (!bos_token_.empty()) bos_id_ = token_to_id(bos_token_);
  if (!eos_token_.empty()) eos_id_ = token_to_id(eos_token_);
  return {};
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  CP_ASSIGN_OR_RETURN(std::string text, read_file(path));
  CP_ASSIGN_OR_RETURN(auto t, from_json(text, path));
  const std::string config_path = dir + "/tokenizer_config.json";
  if (std::ifstream(config_path).good()) {
    CP_ASSIGN_OR_RETURN(std::string config, read_file(config_path));
    CP_RETURN_IF_ERROR(t->load_config(config, config_path));
  }
  return t;
}

size_t Tokenizer::match_added(std::string_view text, size_t pos, int32_t* id) const {
  size_t best = 0;
  int node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto& kids = trie_children_[node];
    const unsigned char c = static_cast<unsigned char>(text[i]);
    auto it = std::find_if(kids.begin(), kids.end(), [c](auto& p) { return p.first == c; });
    if (it == kids.end()) break;
    node = it->second;
    if (trie_token_[node] >= 0) {
      best = i + 1 - pos;
      *id = trie_token_[node];
    }
  }
  return best;
}

template <typename WordFn>
std::vector<int32_t> Tokenizer::encode_with(std::string_view text, WordFn&& encode_word) const {
  std::vector<int32_t> ids;
  std::vector<std::string_view> pieces, next;
  auto encode_segment = [&](std::string_view segment) {
    if (segment.empty()) return;
    pieces.assign(1, segment);
    for (const auto& split : splits_) {
      next.clear();
      for (std::string_view p : pieces) split->split(p, &next);
      pieces.swap(next);
    }
    for (std::string_view p : pieces) encode_word(p, &ids);
  };
  size_t segment_begin = 0;
  for (size_t pos = 0; pos < text.size();) {
    int32_t id = -1;
    const size_t len = trie_children_[0].empty() ? 0 : match_added(text, pos, &id);
    if (len == 0) {
      ++pos;
      continue;
    }
    encode_segment(text.substr(segment_begin, pos - segment_begin));
    ids.push_back(id);
    pos += len;
    segment_begin = pos;
  }
  encode_segment(text.substr(segment_begin));
  return ids;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> ids = encode_with(
      text, [this](std::string_view w, std::vector<int32_t>* out) { bpe_->encode_word(w, out); });
  if (add_bos && bos_id_) ids.insert(ids.begin(), *bos_id_);
  return ids;
}

std::vector<int32_t> Tokenizer::encode_reference(std::string_view text) const {
  return encode_with(text, [this](std::string_view w, std::vector<int32_t>* out) {
    bpe_->encode_word_reference(w, out);
  });
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out;
  for (int32_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    out += token_bytes(id);
  }
  return out;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  static const std::string kEmpty;
  return id >= 0 && id < vocab_size() ? token_bytes_[id] : kEmpty;
}

std::string Tokenizer::token_string(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return is_added_[id] ? token_bytes_[id] : bytes_to_byte_level(token_bytes_[id]);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[id];
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : added_) {
    if (a.content == token) return a.id;
  }
  auto it = bpe_->vocab().find(std::string(token));
  if (it != bpe_->vocab().end()) return it->second;
  return std::nullopt;
}

Result<std::string> deepseek_v31_tokenizer_json(const std::string& v3_json_text) {
  json root = json::parse(v3_json_text, nullptr, false);
  if (root.is_discarded() || !root.contains("added_tokens")) {
    return common::invalid_argument("tokenizer.json: not a tokenizer with added_tokens");
  }
  const std::pair<int, const char*> v31[] = {{128796, "<｜search▁begin｜>"},
                                             {128797, "<｜search▁end｜>"},
                                             {128798, "<think>"},
                                             {128799, "</think>"}};
  int patched = 0;
  for (json& a : root["added_tokens"]) {
    for (const auto& [id, content] : v31) {
      if (a.value("id", -1) == id) {
        a["content"] = content;
        a["special"] = false;
        a["normalized"] = true;
        ++patched;
      }
    }
  }
  if (patched != 4) return common::invalid_argument("tokenizer.json: ids 128796-128799 not found");
  return root.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace tokenizer
