// InstanceRegistry: the proxy's prefill (P) and decode (D) backends and their load, balanced as
// vllm-ascend's load_balance_proxy_server_example.py does: a new request goes to the
// least-loaded ready instance of its role (ties to the oldest), where a P's load is 0.3 times
// the sum of its in-flight requests' predicted prefill costs (bytes/4 * 0.0345 + 120.0745) and
// a D's is its in-flight body bytes. Load is held by a Lease, so every exit path, a cancelled
// stream included, gives it back. Removed instances with requests in flight are tainted (never
// chosen) until they drain. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace proxy {

enum class Role { kPrefill, kDecode };

struct InstanceInfo {
  std::string host;
  int port = 0;
  std::string url() const;  // http://host:port (IPv6 in brackets)
  std::string key() const;  // host:port
};

class InstanceRegistry;

// Load one request puts on one instance; released on destruction or release().
class Lease {
 public:
  Lease() = default;
  Lease(Lease&& other) noexcept { *this = std::move(other); }
  Lease& operator=(Lease&& other) noexcept;
  ~Lease() { release(); }
  void release();
  explicit operator bool() const { return registry_ != nullptr; }
  const InstanceInfo& instance() const { return instance_; }

 private:
  friend class InstanceRegistry;
  InstanceRegistry* registry_ = nullptr;
  Role role_ = Role::kPrefill;
  InstanceInfo instance_;
  double load_ = 0;
};

class InstanceRegistry {
 public:
  // Instances start ready (given on the command line).
  void add(Role role, const InstanceInfo& instance, bool ready = true);
  // Marks a waiting instance ready (its probe answered).
  void set_ready(Role role, const std::string& key);
  // Drops an instance now if idle, else when its last request ends. False if unknown.
  bool remove(Role role, const std::string& key);
  bool contains(Role role, const std::string& key) const;
  // The least-loaded ready instance for a request with a body of body_bytes; an empty lease
  // when there is none.
  Lease acquire(Role role, size_t body_bytes);
  std::vector<InstanceInfo> instances(Role role) const;  // ready ones
  size_t num_ready(Role role) const;
  int64_t requests_in_flight() const;
  // {"prefill": [{"instance", "requests", "load"}...], "decode": [...]}
  nlohmann::json snapshot() const;

  static double prefill_cost(size_t body_bytes) {
    return static_cast<double>(body_bytes) / 4.0 * 0.0345 + 120.0745;
  }

 private:
  friend class Lease;
  struct Entry {
    InstanceInfo info;
    Role role;
    bool ready = true;
    bool tainted = false;
    int64_t requests = 0;
    double load = 0;  // the role's priority
    int64_t ordinal = 0;
  };
  void give_back(Role role, const std::string& key, double load);
  Entry* find(Role role, const std::string& key);
  const Entry* find(Role role, const std::string& key) const;

  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  int64_t next_ordinal_ = 0;
};

}  // namespace proxy
