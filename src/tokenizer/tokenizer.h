// Tokenizer: a Hugging Face tokenizer.json (byte-level BPE, added tokens, Split regex
// pre-tokenizers, ByteLevel decoder) plus tokenizer_config.json (BOS/EOS, add_bos_token,
// chat_template). Immutable after load; encode/decode are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"

namespace tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
};

class Tokenizer {
 public:
  // Parses tokenizer.json text; `source` names it in errors.
  static common::Result<std::unique_ptr<Tokenizer>> from_json(const std::string& json_text,
                                                              const std::string& source);
  // Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  static common::Result<std::unique_ptr<Tokenizer>> load(const std::string& dir);

  // Ids of `text`; added tokens are matched (leftmost-longest) anywhere in it.
  std::vector<int32_t> encode(std::string_view text, bool add_bos = false) const;
  // Reference path for tests: the same pipeline with the O(n²) BPE merge loop and no cache.
  std::vector<int32_t> encode_reference(std::string_view text) const;
  // Bytes of the ids concatenated (may end inside a UTF-8 character).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Raw bytes a token stands for ("" for ids outside the vocabulary).
  const std::string& token_bytes(int32_t id) const;
  // The token as the vocabulary spells it (Hugging Face's convert_ids_to_tokens): an added
  // token's content, else its bytes in the byte-level alphabet ("Ġhi"); "" outside the vocab.
  std::string token_string(int32_t id) const;
  bool is_special(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  int32_t vocab_size() const { return static_cast<int32_t>(token_bytes_.size()); }
  // The longest token's byte count: a text of B bytes encodes to at least B / this many ids.
  size_t max_token_bytes() const { return max_token_bytes_; }
  // Bytes held by the BPE word cache (bounded; see BpeModel).
  size_t word_cache_bytes() const { return bpe_ ? bpe_->cache_bytes() : 0; }
  void set_word_cache_limit_bytes(size_t limit) const {
    if (bpe_) bpe_->set_cache_limit_bytes(limit);
  }

  std::optional<int32_t> bos_token_id() const { return bos_id_; }
  std::optional<int32_t> eos_token_id() const { return eos_id_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  bool add_bos_token() const { return add_bos_token_; }
  const std::string& chat_template() const { return chat_template_; }

 private:
  static common::Result<std::unique_ptr<Tokenizer>> parse_tokenizer_json(
      const std::string& json_text, const std::string& source);
  Tokenizer() = default;
  common::Status load_config(const std::string& json_text, const std::string& source);
  template <typename WordFn>
  std::vector<int32_t> encode_with(std::string_view text, WordFn&& encode_word) const;
  // Length of the longest added token starting at text[pos] (0 if none) and its id.
  size_t match_added(std::string_view text, size_t pos, int32_t* id) const;

  std::optional<BpeModel> bpe_;
  std::vector<std::unique_ptr<RegexSplit>> splits_;  // applied in order
  std::vector<AddedToken> added_;
  // Byte trie over added-token contents: node -> sorted (byte, child); terminal id or -1.
  std::vector<std::vector<std::pair<unsigned char, int32_t>>> trie_children_;
  std::vector<int32_t> trie_token_;
  std::vector<std::string> token_bytes_;
  size_t max_token_bytes_ = 1;
  std::vector<bool> special_;
  std::vector<bool> is_added_;
  std::optional<int32_t> bos_id_, eos_id_;
  std::string bos_token_, eos_token_, chat_template_;
  bool add_bos_token_ = false;
};

// DeepSeek-V3.1 reuses four V3 placeholders: 128796..128799 become <｜search▁begin｜>,
// <｜search▁end｜>, <think>, </think> (non-special). Returns the patched tokenizer.json text.
common::Result<std::string> deepseek_v31_tokenizer_json(const std::string& v3_json_text);

}  // namespace tokenizer
