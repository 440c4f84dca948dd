// The shared-memory collectives: segment set-up, the round barrier, and each collective as
// rounds of "copy into my slot, sync, read the slots".
#include "dist/shm_group.h"

#include <fcntl.h>
#include <immintrin.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "common/timer.h"
#include "dist/futex.h"

namespace dist {

struct ShmGroup::Header {
  uint64_t magic;
  uint32_t size;
  uint64_t slot_bytes;
  alignas(64) std::atomic<uint32_t> arrivals;  // total sync arrivals: the futex word
  alignas(64) std::atomic<uint32_t> sleepers;  // ranks inside futex_wait
  alignas(64) std::atomic<uint32_t> aborted;   // 0; 1 while the reason is written; 2 after
  char abort_reason[512];
  std::atomic<int32_t> pids[kMaxRanks];
};

namespace {

constexpr uint64_t kMagic = 0x63707368'6d677270ULL;  // "cpshmgrp"
constexpr size_t kHeaderBytes = 4096;

std::string errno_text() {
  return std::strerror(errno);
}

// Whether pid has ended (gone, or a zombie no one has reaped yet).
bool process_ended(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm, state;
  if (!(stat >> pid_field)) return true;
  // comm is parenthesised and may hold spaces: the state follows the last ')'.
  std::string rest((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = rest.rfind(')');
  if (close == std::string::npos || close + 2 >= rest.size()) return false;
  const char s = rest[close + 2];
  return s == 'Z' || s == 'X';
}

}  // namespace

common::Result<std::unique_ptr<ShmGroup>> ShmGroup::create(StoreClient& store,
                                                           const std::string& key,
                                                           const ShmGroupOptions& options) {
  if (options.size < 1 || options.size > kMaxRanks || options.rank < 0 ||
      options.rank >= options.size)
    return common::invalid_argument(options.name + ": rank " + std::to_string(options.rank) +
                                    " of " + std::to_string(options.size) + " is out of range");
  std::unique_ptr<ShmGroup> g(new ShmGroup(options));
  g->o_.slot_bytes = std::max<size_t>(4096, options.slot_bytes / 64 * 64);
  if (options.rank == 0) {
    std::random_device rd;
    char name[64];
    std::snprintf(name, sizeof(name), "/chunkpipe-group-%d-%08x%08x", int(getpid()), rd(), rd());
    const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return common::unavailable(options.name + ": shm_open: " + errno_text());
    g->shm_name_ = name;
    CP_RETURN_IF_ERROR(g->map(fd, /*init=*/true));
    CP_RETURN_IF_ERROR(store.set(key, Bytes(name, name + std::strlen(name))));
  } else {
    CP_ASSIGN_OR_RETURN(Bytes name_bytes, store.get(key));
    const std::string name(name_bytes.begin(), name_bytes.end());
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0)
      return common::unavailable(options.name + ": cannot open rank 0's segment " + name + ": " +
                                 errno_text() + " (are all ranks of the group on one host?)");
    CP_RETURN_IF_ERROR(g->map(fd, /*init=*/false));
  }
  g->header_->pids[options.rank].store(getpid());
  // Every rank attached: the name can go (the mapping stays), so nothing is left behind.
  CP_RETURN_IF_ERROR(g->sync("attach"));
  if (!g->shm_name_.empty()) {
    shm_unlink(g->shm_name_.c_str());
    g->shm_name_.clear();
  }
  return g;
}

common::Status ShmGroup::map(int fd, bool init) {
  const size_t slots = 2 * size_t(o_.size) * o_.slot_bytes;
  size_t bytes = kHeaderBytes + slots;
  if (init && ftruncate(fd, off_t(bytes)) != 0) {
    const std::string why = errno_text();
    close(fd);
    return common::unavailable(o_.name + ": cannot size the shared segment to " +
                               std::to_string(bytes) + " bytes: " + why);
  }
  if (!init) {
    struct stat st {};
    if (fstat(fd, &st) != 0 || size_t(st.st_size) < kHeaderBytes) {
      close(fd);
      return common::data_loss(o_.name + ": rank 0's segment is not a group segment");
    }
    bytes = size_t(st.st_size);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return common::unavailable(o_.name + ": mmap: " + errno_text());
  map_bytes_ = bytes;
  header_ = static_cast<Header*>(p);
  slots_ = static_cast<uint8_t*>(p) + kHeaderBytes;
  if (init) {
    header_->magic = kMagic;
    header_->size = uint32_t(o_.size);
    header_->slot_bytes = o_.slot_bytes;
  } else if (header_->magic != kMagic || header_->size != uint32_t(o_.size) ||
             bytes != kHeaderBytes + 2 * size_t(o_.size) * header_->slot_bytes) {
    return common::data_loss(o_.name + ": rank 0's segment was made for another group layout");
  }
  o_.slot_bytes = header_->slot_bytes;
  return {};
}

ShmGroup::~ShmGroup() {
  if (!shm_name_.empty()) shm_unlink(shm_name_.c_str());
  if (header_ != nullptr) munmap(header_, map_bytes_);
}

void ShmGroup::abort(const std::string& why) {
  uint32_t expected = 0;
  if (header_->aborted.compare_exchange_strong(expected, 1)) {
    const std::string text = why.substr(0, sizeof(header_->abort_reason) - 1);
    std::memcpy(header_->abort_reason, text.c_str(), text.size() + 1);
    header_->aborted.store(2);
  }
  futex_wake_all(&header_->arrivals);
}

std::string ShmGroup::abort_reason() const {
  // The aborter writes the reason between the flag's 1 and 2; one killed in between must not
  // leave the others spinning.
  for (int spin = 0; spin < 1000000 && header_->aborted.load() != 2; ++spin) _mm_pause();
  if (header_->aborted.load() != 2) return "another rank aborted the group";
  return std::string(header_->abort_reason);
}

std::string ShmGroup::dead_peer() const {
  for (int p = 0; p < o_.size; ++p) {
    const pid_t pid = header_->pids[p].load();
    if (pid > 0 && pid != getpid() && process_ended(pid))
      return "rank " + std::to_string(p) + " (pid " + std::to_string(pid) + ") has exited";
  }
  return "";
}

common::Status ShmGroup::sync(const char* what) {
  const uint32_t n = uint32_t(o_.size);
  ++epoch_;
  const uint32_t target = epoch_ * n;  // wraps: compared as a signed distance
  auto reached = [&](uint32_t v) { return int32_t(v - target) >= 0; };
  auto failed = [&](const std::string& why) {
    return common::unavailable(o_.name + ": " + what + " failed on rank " +
                               std::to_string(o_.rank) + ": " + why);
  };
  if (header_->aborted.load() != 0) return failed(abort_reason());
  if (header_->arrivals.fetch_add(1) + 1 == target) {
    if (header_->sleepers.load() != 0) futex_wake_all(&header_->arrivals);
    return {};
  }
  for (int spin = 0; spin < 4000; ++spin) {  // a peer a few microseconds behind
    if (reached(header_->arrivals.load(std::memory_order_acquire))) return {};
    _mm_pause();
  }
  const double start = common::now_seconds();
  double next_liveness_check = start + 0.1;
  while (true) {
    header_->sleepers.fetch_add(1);
    const uint32_t seen = header_->arrivals.load();
    if (!reached(seen) && header_->aborted.load() == 0) futex_wait(&header_->arrivals, seen, 20);
    header_->sleepers.fetch_sub(1);
    if (reached(header_->arrivals.load(std::memory_order_acquire))) return {};
    if (header_->aborted.load() != 0) return failed(abort_reason());
    const double now = common::now_seconds();
    if (now >= next_liveness_check) {
      next_liveness_check = now + 0.1;
      const std::string dead = dead_peer();
      if (!dead.empty()) {
        abort(o_.name + ": " + dead);
        return failed(dead);
      }
    }
    if (now - start > o_.timeout_s) {
      const std::string why =
          "no answer from every rank within " + std::to_string(int(o_.timeout_s)) + " s (timeout)";
      abort(o_.name + ": " + what + " on rank " + std::to_string(o_.rank) + ": " + why);
      return common::deadline_exceeded(o_.name + ": " + what + " on rank " +
                                       std::to_string(o_.rank) + ": " + why);
    }
  }
}

uint8_t* ShmGroup::my_next_slot() const {
  const size_t set = (epoch_ + 1) & 1;
  return slots_ + (set * size_t(o_.size) + size_t(o_.rank)) * o_.slot_bytes;
}

const uint8_t* ShmGroup::slot(int p) const {
  const size_t set = epoch_ & 1;
  return slots_ + (set * size_t(o_.size) + size_t(p)) * o_.slot_bytes;
}

template <typename T>
common::Status ShmGroup::reduce(T* data, size_t count, ReduceOp op) {
  const size_t per_round = o_.slot_bytes / sizeof(T);
  for (size_t off = 0; off < count; off += per_round) {
    const size_t n = std::min(per_round, count - off);
    std::memcpy(my_next_slot(), data + off, n * sizeof(T));
    CP_RETURN_IF_ERROR(sync("all_reduce"));
    // Rank order on every rank: the same bits everywhere.
    T* out = data + off;
    std::memcpy(out, slot(0), n * sizeof(T));
    for (int p = 1; p < o_.size; ++p) {
      const T* in = reinterpret_cast<const T*>(slot(p));
      if (op == ReduceOp::kSum) {
        for (size_t i = 0; i < n; ++i) out[i] += in[i];
      } else {
        for (size_t i = 0; i < n; ++i) out[i] = std::max(out[i], in[i]);
      }
    }
  }
  return {};
}

common::Status ShmGroup::all_reduce(float* data, size_t count, ReduceOp op) {
  return reduce(data, count, op);
}

common::Status ShmGroup::all_reduce(int64_t* data, size_t count, ReduceOp op) {
  return reduce(data, count, op);
}

common::Status ShmGroup::all_gather(const void* in, size_t bytes, void* out) {
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  for (size_t off = 0; off < bytes; off += o_.slot_bytes) {
    const size_t n = std::min(o_.slot_bytes, bytes - off);
    std::memcpy(my_next_slot(), src + off, n);
    CP_RETURN_IF_ERROR(sync("all_gather"));
    for (int p = 0; p < o_.size; ++p) std::memcpy(dst + size_t(p) * bytes + off, slot(p), n);
  }
  return {};
}

common::Status ShmGroup::reduce_scatter(const float* in, float* out, size_t count) {
  const size_t per_round = o_.slot_bytes / sizeof(float) / size_t(o_.size);
  for (size_t off = 0; off < count; off += per_round) {
    const size_t n = std::min(per_round, count - off);
    auto* mine = reinterpret_cast<float*>(my_next_slot());
    for (int p = 0; p < o_.size; ++p)
      std::memcpy(mine + size_t(p) * n, in + size_t(p) * count + off, n * sizeof(float));
    CP_RETURN_IF_ERROR(sync("reduce_scatter"));
    float* dst = out + off;
    const size_t at = size_t(o_.rank) * n;
    std::memcpy(dst, reinterpret_cast<const float*>(slot(0)) + at, n * sizeof(float));
    for (int p = 1; p < o_.size; ++p) {
      const float* src = reinterpret_cast<const float*>(slot(p)) + at;
      for (size_t i = 0; i < n; ++i) dst[i] += src[i];
    }
  }
  return {};
}

common::Status ShmGroup::all_to_all_v(const void* in, const std::vector<size_t>& send_bytes,
                                      void* out, const std::vector<size_t>& recv_bytes) {
  const size_t n = size_t(o_.size);
  if (send_bytes.size() != n || recv_bytes.size() != n)
    return common::invalid_argument(o_.name + ": all_to_all_v needs one count per rank");
  // Each round moves up to `window` bytes between every pair; the busiest pair sets the
  // number of rounds, which every rank must agree on.
  const size_t window = o_.slot_bytes / n / 64 * 64;
  int64_t rounds = 0;
  for (size_t p = 0; p < n; ++p)
    rounds = std::max<int64_t>(
        rounds, int64_t((std::max(send_bytes[p], recv_bytes[p]) + window - 1) / window));
  CP_RETURN_IF_ERROR(reduce(&rounds, 1, ReduceOp::kMax));
  std::vector<size_t> send_at(n, 0), recv_at(n, 0);
  for (size_t p = 1; p < n; ++p) {
    send_at[p] = send_at[p - 1] + send_bytes[p - 1];
    recv_at[p] = recv_at[p - 1] + recv_bytes[p - 1];
  }
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  auto part = [&](size_t total, int64_t round) {
    const size_t done = size_t(round) * window;
    return total > done ? std::min(window, total - done) : size_t(0);
  };
  for (int64_t r = 0; r < rounds; ++r) {
    uint8_t* mine = my_next_slot();
    for (size_t p = 0; p < n; ++p) {
      if (const size_t len = part(send_bytes[p], r))
        std::memcpy(mine + p * window, src + send_at[p] + size_t(r) * window, len);
    }
    CP_RETURN_IF_ERROR(sync("all_to_all_v"));
    for (size_t q = 0; q < n; ++q) {
      if (const size_t len = part(recv_bytes[q], r))
        std::memcpy(dst + recv_at[q] + size_t(r) * window, slot(int(q)) + size_t(o_.rank) * window,
                    len);
    }
  }
  return {};
}

common::Status ShmGroup::broadcast(void* data, size_t bytes, int root) {
  if (root < 0 || root >= o_.size)
    return common::invalid_argument(o_.name + ": broadcast root " + std::to_string(root) +
                                    " is not a rank");
  auto* p = static_cast<uint8_t*>(data);
  for (size_t off = 0; off < bytes; off += o_.slot_bytes) {
    const size_t n = std::min(o_.slot_bytes, bytes - off);
    if (o_.rank == root) std::memcpy(my_next_slot(), p + off, n);
    CP_RETURN_IF_ERROR(sync("broadcast"));
    if (o_.rank != root) std::memcpy(p + off, slot(root), n);
  }
  return {};
}

common::Status ShmGroup::barrier() {
  return sync("barrier");
}

}  // namespace dist
