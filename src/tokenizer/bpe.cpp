// BPE merge loop with a min-heap of candidate pairs (rank, then position) over a linked list of
// symbols: O(n log n) per word, so long CJK runs or whitespace runs stay cheap.
#include "tokenizer/bpe.h"

#include <queue>

#include "tokenizer/byte_level.h"

namespace tokenizer {

common::Result<BpeModel> BpeModel::create(
    std::unordered_map<std::string, int32_t> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges) {
  BpeModel m;
  m.vocab_ = std::move(vocab);
  for (int b = 0; b < 256; ++b) {
    const std::string ch = bytes_to_byte_level(std::string(1, static_cast<char>(b)));
    auto it = m.vocab_.find(ch);
    if (it == m.vocab_.end()) {
      return common::invalid_argument(
          "tokenizer.json: vocab lacks the byte-level symbol for byte " + std::to_string(b));
    }
    m.byte_ids_[b] = it->second;
  }
  m.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto a = m.vocab_.find(left), b = m.vocab_.find(right), c = m.vocab_.find(left + right);
    if (a == m.vocab_.end() || b == m.vocab_.end() || c == m.vocab_.end()) {
      return common::invalid_argument("tokenizer.json: merge " + std::to_string(rank) + " '" +
                                      left + " " + right + "' uses a token missing from the vocab");
    }
    m.merges_.emplace(pair_key(a->second, b->second),
                      Merge{static_cast<int32_t>(rank), c->second});  // first rank wins
  }
  return m;
}

BpeModel::BpeModel(BpeModel&& other) noexcept
    : vocab_(std::move(other.vocab_)), merges_(std::move(other.merges_)), cache_() {
  std::copy(std::begin(other.byte_ids_), std::end(other.byte_ids_), byte_ids_);
}

void BpeModel::merge_symbols(std::vector<int32_t>* symbols) const {
  std::vector<int32_t>& ids = *symbols;
  const int n = static_cast<int>(ids.size());
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int left, right;
    int32_t left_id, right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    const int right = next[left];
    if (const Merge* m = find_merge(ids[left], ids[right])) {
      heap.push({m->rank, left, right, ids[left], ids[right]});
    }
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    // Stale if either side changed since the candidate was pushed.
    if (next[c.left] != c.right || ids[c.left] != c.left_id || ids[c.right] != c.right_id) continue;
    ids[c.left] = find_merge(c.left_id, c.right_id)->merged_id;
    ids[c.right] = -1;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    push(prev[c.left]);
    push(c.left);
  }
  int out = 0;
  for (int i = 0; i < n; ++i) {
    if (ids[i] >= 0) ids[out++] = ids[i];
  }
  ids.resize(out);
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>* out) const {
  const bool cacheable = bytes.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(std::string(bytes));
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(bytes.size());
  for (unsigned char b : bytes) ids.push_back(byte_ids_[b]);
  merge_symbols(&ids);
  out->insert(out->end(), ids.begin(), ids.end());
  if (!cacheable) return;
  // Entry cost: key and id bytes plus the node and bucket overhead of the map.
  const size_t cost = bytes.size() + ids.size() * sizeof(int32_t) + 96;
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_bytes_ + cost > cache_limit_bytes_) {
    cache_.clear();
    cache_bytes_ = 0;
  }
  if (cache_.emplace(std::string(bytes), std::move(ids)).second) cache_bytes_ += cost;
}

void BpeModel::encode_word_reference(std::string_view bytes, std::vector<int32_t>* out) const {
  std::vector<int32_t> ids;
  for (unsigned char b : bytes) ids.push_back(byte_ids_[b]);
  while (true) {
    int best = -1;
    int32_t best_rank = INT32_MAX;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const Merge* m = find_merge(ids[i], ids[i + 1]);
      if (m != nullptr && m->rank < best_rank) {
        best_rank = m->rank;
        best = static_cast<int>(i);
      }
    }
    if (best < 0) break;
    ids[best] = find_merge(ids[best], ids[best + 1])->merged_id;
    ids.erase(ids.begin() + best + 1);
  }
  out->insert(out->end(), ids.begin(), ids.end());
}

}  // namespace tokenizer
