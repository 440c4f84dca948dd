// WireWriter / WireReader: little helpers that serialize plain values and vectors of them into
// a byte buffer (host byte order: every rank runs the same binary on x86-64). The reader
// bounds-checks every read, because bytes may arrive from another host. Thread-compatible.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dist {

class WireWriter {
 public:
  explicit WireWriter(std::vector<uint8_t>* out) : out_(out) {}
  template <typename T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    append(&v, sizeof(T));
  }
  template <typename T>
  void put_vector(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<uint64_t>(v.size());
    append(v.data(), v.size() * sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    append(s.data(), s.size());
  }
  void put_strings(const std::vector<std::string>& v) {
    put<uint64_t>(v.size());
    for (const auto& s : v) put_string(s);
  }
  // (id, value) pairs as two parallel vectors.
  void put_pairs(const std::vector<std::pair<int32_t, float>>& v) {
    std::vector<int32_t> ids;
    std::vector<float> values;
    for (const auto& [id, x] : v) ids.push_back(id), values.push_back(x);
    put_vector(ids);
    put_vector(values);
  }

 private:
  // resize + memcpy rather than insert: g++ 12 misreports insert into a small vector.
  void append(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = out_->size();
    out_->resize(at + n);
    std::memcpy(out_->data() + at, p, n);
  }
  std::vector<uint8_t>* out_;
};

// Every getter returns false (and leaves the reader failed) on truncated input.
class WireReader {
 public:
  explicit WireReader(const std::vector<uint8_t>& in) : in_(in) {}
  template <typename T>
  bool get(T* v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (!ok_ || in_.size() - pos_ < sizeof(T)) return ok_ = false;
    std::memcpy(v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  template <typename T>
  bool get_vector(std::vector<T>* v) {
    uint64_t n = 0;
    if (!get(&n) || n > (in_.size() - pos_) / sizeof(T)) return ok_ = false;
    v->resize(n);
    if (n > 0) std::memcpy(v->data(), in_.data() + pos_, n * sizeof(T));  // data() may be null
    pos_ += n * sizeof(T);
    return true;
  }
  bool get_string(std::string* s) {
    uint64_t n = 0;
    if (!get(&n) || n > in_.size() - pos_) return ok_ = false;
    s->assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool get_strings(std::vector<std::string>* v) {
    uint64_t n = 0;
    // Each string takes at least its 8-byte length.
    if (!get(&n) || n > (in_.size() - pos_) / sizeof(uint64_t)) return ok_ = false;
    v->resize(n);
    for (auto& s : *v) get_string(&s);
    return ok_;
  }
  bool get_pairs(std::vector<std::pair<int32_t, float>>* v) {
    std::vector<int32_t> ids;
    std::vector<float> values;
    get_vector(&ids);
    get_vector(&values);
    if (!ok_ || ids.size() != values.size()) return ok_ = false;
    v->clear();
    for (size_t i = 0; i < ids.size(); ++i) v->emplace_back(ids[i], values[i]);
    return true;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return ok_ && pos_ == in_.size(); }

 private:
  const std::vector<uint8_t>& in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace dist
