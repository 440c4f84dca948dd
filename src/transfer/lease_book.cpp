// Lease bookkeeping of the prefill side of the pull connector.
#include "transfer/lease_book.h"

#include <iterator>

namespace transfer {

void LeaseBook::add(const std::vector<std::string>& request_ids, double now) {
  for (const std::string& id : request_ids) {
    auto early = early_done_.find(id);
    if (early != early_done_.end()) {
      // The decoder read before this worker heard of the lease (the scheduler already held
      // the blocks, since P answers only after that).
      ended_[id] = {now, early->second.token};
      early_done_.erase(early);
      to_free_.push_back(id);
    } else {
      leases_[id] = now + lease_seconds_;
    }
  }
}

bool LeaseBook::done(const std::string& id, uint64_t token, double now) {
  if (leases_.erase(id)) {
    ended_[id] = {now, token};
    to_free_.push_back(id);
    return true;
  }
  auto ended = ended_.find(id);
  if (ended != ended_.end()) return ended->second.token == token;  // a resent DONE is fine
  if (expired_.count(id)) return false;
  early_done_[id] = {now, token};
  return true;
}

std::vector<std::string> LeaseBook::expire(double now) {
  std::vector<std::string> out;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second > now) {
      ++it;
      continue;
    }
    out.push_back(it->first);
    to_free_.push_back(it->first);
    expired_[it->first] = now;
    it = leases_.erase(it);
  }
  prune(now);
  return out;
}

std::vector<std::string> LeaseBook::take_ended() {
  std::vector<std::string> out;
  out.swap(to_free_);
  return out;
}

// Stray DONEs and the memory of ended leases are forgotten after another lease period.
void LeaseBook::prune(double now) {
  auto old = [&](double when) { return now - when > lease_seconds_; };
  for (auto it = early_done_.begin(); it != early_done_.end();)
    it = old(it->second.when) ? early_done_.erase(it) : std::next(it);
  for (auto it = ended_.begin(); it != ended_.end();)
    it = old(it->second.when) ? ended_.erase(it) : std::next(it);
  for (auto it = expired_.begin(); it != expired_.end();)
    it = old(it->second) ? expired_.erase(it) : std::next(it);
}

}  // namespace transfer
