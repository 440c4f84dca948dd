// The shared ring: a page-aligned header with the byte counters, then the data.
#include "dist/shm_pipe.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "dist/futex.h"

namespace dist {

struct ShmPipe::Header {
  std::atomic<uint64_t> written;    // total bytes ever written (the writer's counter)
  std::atomic<uint64_t> consumed;   // total bytes ever read (the reader's counter)
  std::atomic<uint32_t> write_seq;  // bumped after each write: the reader's futex word
  std::atomic<uint32_t> read_seq;   // bumped after each read: the writer's futex word
  std::atomic<uint32_t> closed;
  uint64_t capacity;
};

namespace {

constexpr size_t kHeaderBytes = 4096;
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

common::Result<ShmPipe> ShmPipe::create(size_t capacity) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  capacity = std::max(page, (capacity + page - 1) / page * page);
  const int fd = memfd_create("chunkpipe-pipe", MFD_CLOEXEC);
  if (fd < 0) return common::invalid_argument("memfd_create failed: " + errno_text());
  if (ftruncate(fd, static_cast<off_t>(kHeaderBytes + capacity)) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    return common::invalid_argument("cannot size a shared-memory pipe of " +
                                    std::to_string(capacity) + " bytes: " + why);
  }
  auto pipe = attach(fd);
  if (!pipe.ok()) {
    ::close(fd);
    return pipe.status();
  }
  Header* h = pipe->header_;
  h->written.store(0);
  h->consumed.store(0);
  h->write_seq.store(0);
  h->read_seq.store(0);
  h->closed.store(0);
  h->capacity = capacity;
  return pipe;
}

common::Result<ShmPipe> ShmPipe::attach(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size <= static_cast<off_t>(kHeaderBytes))
    return common::invalid_argument("fd " + std::to_string(fd) + " is not a shared-memory pipe");
  void* p =
      mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return common::invalid_argument("mmap of a pipe failed: " + errno_text());
  ShmPipe pipe;
  pipe.fd_ = fd;
  pipe.map_bytes_ = static_cast<size_t>(st.st_size);
  pipe.header_ = static_cast<Header*>(p);
  pipe.ring_ = static_cast<uint8_t*>(p) + kHeaderBytes;
  return pipe;
}

ShmPipe::ShmPipe(ShmPipe&& other) noexcept {
  *this = std::move(other);
}

ShmPipe& ShmPipe::operator=(ShmPipe&& other) noexcept {
  if (this != &other) {
    this->~ShmPipe();
    header_ = std::exchange(other.header_, nullptr);
    ring_ = std::exchange(other.ring_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

ShmPipe::~ShmPipe() {
  if (header_ != nullptr) munmap(header_, map_bytes_);
  if (fd_ >= 0) ::close(fd_);
  header_ = nullptr;
  fd_ = -1;
}

common::Status ShmPipe::write(const void* data, size_t n) {
  const uint8_t* src = static_cast<const uint8_t*>(data);
  const uint64_t cap = header_->capacity;
  while (n > 0) {
    const uint32_t seq = header_->read_seq.load(std::memory_order_acquire);
    if (header_->closed.load(std::memory_order_acquire))
      return common::invalid_argument("the peer closed the pipe");
    const uint64_t w = header_->written.load(std::memory_order_relaxed);
    const uint64_t room = cap - (w - header_->consumed.load(std::memory_order_acquire));
    if (room == 0) {
      futex_wait(&header_->read_seq, seq, 50);
      continue;
    }
    const uint64_t k = std::min<uint64_t>(room, n);
    const uint64_t at = w % cap, first = std::min(k, cap - at);
    std::memcpy(ring_ + at, src, first);
    std::memcpy(ring_, src + first, k - first);
    header_->written.store(w + k, std::memory_order_release);
    header_->write_seq.fetch_add(1, std::memory_order_release);
    futex_wake_all(&header_->write_seq);
    src += k;
    n -= k;
  }
  return {};
}

common::Status ShmPipe::read(void* data, size_t n) {
  uint8_t* dst = static_cast<uint8_t*>(data);
  const uint64_t cap = header_->capacity;
  while (n > 0) {
    const uint32_t seq = header_->write_seq.load(std::memory_order_acquire);
    const uint64_t r = header_->consumed.load(std::memory_order_relaxed);
    const uint64_t avail = header_->written.load(std::memory_order_acquire) - r;
    if (avail == 0) {
      if (header_->closed.load(std::memory_order_acquire))
        return common::invalid_argument("the peer closed the pipe");
      futex_wait(&header_->write_seq, seq, 50);
      continue;
    }
    const uint64_t k = std::min<uint64_t>(avail, n);
    const uint64_t at = r % cap, first = std::min(k, cap - at);
    std::memcpy(dst, ring_ + at, first);
    std::memcpy(dst + first, ring_, k - first);
    header_->consumed.store(r + k, std::memory_order_release);
    header_->read_seq.fetch_add(1, std::memory_order_release);
    futex_wake_all(&header_->read_seq);
    dst += k;
    n -= k;
  }
  return {};
}

void ShmPipe::close() {
  if (header_ == nullptr) return;
  header_->closed.store(1, std::memory_order_release);
  header_->write_seq.fetch_add(1, std::memory_order_release);
  header_->read_seq.fetch_add(1, std::memory_order_release);
  futex_wake_all(&header_->write_seq);
  futex_wake_all(&header_->read_seq);
}

bool ShmPipe::closed() const {
  return header_ == nullptr || header_->closed.load(std::memory_order_acquire) != 0;
}

}  // namespace dist
