// Least-loaded selection with leases.
#include "proxy/instance_registry.h"

#include <algorithm>

namespace proxy {

std::string InstanceInfo::url() const {
  const bool v6 = host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string InstanceInfo::key() const {
  return host + ":" + std::to_string(port);
}

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release();
    registry_ = other.registry_;
    role_ = other.role_;
    instance_ = std::move(other.instance_);
    load_ = other.load_;
    other.registry_ = nullptr;
  }
  return *this;
}

void Lease::release() {
  if (registry_ == nullptr) return;
  registry_->give_back(role_, instance_.key(), load_);
  registry_ = nullptr;
}

void InstanceRegistry::add(Role role, const InstanceInfo& instance, bool ready) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find(role, instance.key())) {
    e->tainted = false;  // re-added while draining: keep it
    e->ready = e->ready || ready;
    return;
  }
  entries_.push_back({instance, role, ready, false, 0, 0.0, next_ordinal_++});
}

void InstanceRegistry::set_ready(Role role, const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find(role, key)) e->ready = true;
}

bool InstanceRegistry::remove(Role role, const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry* e = find(role, key);
  if (e == nullptr) return false;
  if (e->requests > 0) {
    e->tainted = true;
    return true;
  }
  entries_.erase(entries_.begin() + (e - entries_.data()));
  return true;
}

bool InstanceRegistry::contains(Role role, const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Entry* e = find(role, key);
  return e != nullptr && !e->tainted;
}

Lease InstanceRegistry::acquire(Role role, size_t body_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry* best = nullptr;
  for (Entry& e : entries_) {
    if (e.role != role || !e.ready || e.tainted) continue;
    if (best == nullptr || e.load < best->load ||
        (e.load == best->load && e.ordinal < best->ordinal))
      best = &e;
  }
  Lease lease;
  if (best == nullptr) return lease;
  const double load =
      role == Role::kPrefill ? 0.3 * prefill_cost(body_bytes) : static_cast<double>(body_bytes);
  best->load += load;
  ++best->requests;
  lease.registry_ = this;
  lease.role_ = role;
  lease.instance_ = best->info;
  lease.load_ = load;
  return lease;
}

void InstanceRegistry::give_back(Role role, const std::string& key, double load) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry* e = find(role, key);
  if (e == nullptr) return;
  e->load = std::max(0.0, e->load - load);
  if (--e->requests == 0) {
    e->load = 0;  // no drift from rounding
    if (e->tainted) entries_.erase(entries_.begin() + (e - entries_.data()));
  }
}

std::vector<InstanceInfo> InstanceRegistry::instances(Role role) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<InstanceInfo> out;
  for (const Entry& e : entries_)
    if (e.role == role && e.ready && !e.tainted) out.push_back(e.info);
  return out;
}

size_t InstanceRegistry::num_ready(Role role) const {
  return instances(role).size();
}

int64_t InstanceRegistry::requests_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const Entry& e : entries_) n += e.requests;
  return n;
}

nlohmann::json InstanceRegistry::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json out = {{"prefill", nlohmann::json::array()}, {"decode", nlohmann::json::array()}};
  for (const Entry& e : entries_) {
    out[e.role == Role::kPrefill ? "prefill" : "decode"].push_back({{"instance", e.info.key()},
                                                                    {"requests", e.requests},
                                                                    {"load", e.load},
                                                                    {"ready", e.ready},
                                                                    {"tainted", e.tainted}});
  }
  return out;
}

InstanceRegistry::Entry* InstanceRegistry::find(Role role, const std::string& key) {
  for (Entry& e : entries_)
    if (e.role == role && e.info.key() == key) return &e;
  return nullptr;
}

const InstanceRegistry::Entry* InstanceRegistry::find(Role role, const std::string& key) const {
  for (const Entry& e : entries_)
    if (e.role == role && e.info.key() == key) return &e;
  return nullptr;
}

}  // namespace proxy
