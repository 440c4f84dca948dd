// Byte-level BPE model: vocabulary, ranked merges, and the merge loop for one pre-token.
// Immutable after construction except for an internal word cache guarded by a mutex, so
// encode_word() is thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace tokenizer {

class BpeModel {
 public:
  // vocab: byte-level token text -> id. merges: pairs of token texts in rank order.
  static common::Result<BpeModel> create(
      std::unordered_map<std::string, int32_t> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges);

  BpeModel(BpeModel&& other) noexcept;
  BpeModel& operator=(BpeModel&&) = delete;

  // Appends the ids of `bytes` (raw bytes of one pre-token) to `out`.
  void encode_word(std::string_view bytes, std::vector<int32_t>* out) const;
  // Reference implementation: repeatedly merges the lowest-ranked adjacent pair, leftmost
  // first, in O(n²); used by tests to check the heap-based encode_word.
  void encode_word_reference(std::string_view bytes, std::vector<int32_t>* out) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }

  // The word cache is bounded by bytes (keys + ids), and words longer than this are not cached:
  // distinct long words from clients could otherwise grow it without limit.
  static constexpr size_t kMaxCachedWordBytes = 256;
  static constexpr size_t kDefaultCacheLimitBytes = 16 << 20;
  size_t cache_bytes() const {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    return cache_bytes_;
  }
  void set_cache_limit_bytes(size_t limit) const {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    cache_limit_bytes_ = limit;
  }

 private:
  BpeModel() = default;
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* find_merge(int32_t a, int32_t b) const {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }
  void merge_symbols(std::vector<int32_t>* symbols) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t byte_ids_[256] = {};
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
  mutable size_t cache_bytes_ = 0;
  mutable size_t cache_limit_bytes_ = kDefaultCacheLimitBytes;
};

}  // namespace tokenizer
