// LeaseBook: a prefill worker's record of which requests' blocks wait for a decoder's DONE.
// A lease ends once, by DONE or by expiry; a DONE that comes later is answered kExpired
// (the blocks may hold another request's KV by then), except a repeat of the very DONE that
// ended it: each DONE carries its sender's token, and a client that timed out waiting for
// the ACK and sent the same DONE again must not be told its good read was spoiled.
// Not thread-safe: the owner serialises calls (PullSender holds its mutex around them).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace transfer {

class LeaseBook {
 public:
  explicit LeaseBook(double lease_seconds) : lease_seconds_(lease_seconds) {}

  // Requests whose blocks now wait for a DONE; one whose DONE came first ends at once.
  void add(const std::vector<std::string>& request_ids, double now);
  // A DONE for `id` from the sender that made `token`: true (ACK) unless the lease had already
  // ended some other way (false: the reader must discard what it read).
  bool done(const std::string& id, uint64_t token, double now);
  // Ends the leases past their deadline; returns their ids.
  std::vector<std::string> expire(double now);
  // Leases ended (by DONE or expiry) since the last call, whose blocks may be freed now.
  std::vector<std::string> take_ended();
  size_t active() const { return leases_.size(); }

 private:
  struct Stamp {
    double when = 0;
    uint64_t token = 0;
  };
  void prune(double now);

  double lease_seconds_;
  std::unordered_map<std::string, double> leases_;     // id -> deadline
  std::unordered_map<std::string, Stamp> early_done_;  // a DONE before its lease
  std::unordered_map<std::string, Stamp> ended_;       // ended by this DONE
  std::unordered_map<std::string, double> expired_;    // id -> when it expired
  std::vector<std::string> to_free_;
};

}  // namespace transfer
