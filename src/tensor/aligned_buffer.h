// AlignedBuffer<T>: an owning, 64-byte aligned, zero-initialised array of trivially copyable T.
// Buffers of 1 MiB and more come from anonymous mmap, so their zero pages are committed only
// when touched (a large KV cache costs nothing until used), and ask for transparent huge pages:
// the attention walks keys 96 rows apart, which misses a 4 KiB-page TLB. Move-only; plain memory.
#pragma once

#include <sys/mman.h>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

namespace tensor {

template <typename T>
class AlignedBuffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  static constexpr size_t kAlignment = 64;

  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t size) { resize(size); }
  AlignedBuffer(AlignedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        mapped_bytes_(std::exchange(other.mapped_bytes_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { release(); }

  // Discards the contents; the new buffer is zero-filled.
  void resize(size_t size) {
    release();
    size_ = size;
    if (size == 0) return;
    size_t bytes = (size * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
    if (bytes >= kMmapThreshold) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      // Advice only: where THP is off (or "never"), the pages stay 4 KiB and nothing fails.
      (void)madvise(p, bytes, MADV_HUGEPAGE);
      data_ = static_cast<T*>(p);
      mapped_bytes_ = bytes;
      return;
    }
    data_ = static_cast<T*>(std::aligned_alloc(kAlignment, bytes));
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(static_cast<void*>(data_), 0, bytes);
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  static constexpr size_t kMmapThreshold = size_t{1} << 20;

  void release() {
    if (mapped_bytes_ > 0) {
      munmap(data_, mapped_bytes_);
    } else {
      std::free(data_);
    }
    data_ = nullptr;
    size_ = 0;
    mapped_bytes_ = 0;
  }

  T* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_bytes_ = 0;  // > 0 when data_ came from mmap
};

}  // namespace tensor
