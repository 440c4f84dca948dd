// The rendezvous store's server loop and client calls, over the ZeroMQ request channel.
#include "dist/rendezvous_store.h"

#include <chrono>

#include "common/timer.h"
#include "dist/wire.h"

namespace dist {
namespace {

enum Op : uint8_t { kSet = 1, kGet = 2 };
enum Reply : uint8_t { kOk = 1, kMissing = 2, kBad = 3 };

}  // namespace

common::Result<std::unique_ptr<StoreServer>> StoreServer::start(const std::string& host, int port) {
  std::unique_ptr<StoreServer> s(new StoreServer());
  CP_ASSIGN_OR_RETURN(s->server_,
                      RequestServer::bind(host, port, "the rendezvous store (--master-port)"));
  s->thread_ = std::thread([p = s.get()] {
    while (!p->stopping_) p->server_->serve(50, -1, [p](const Bytes& r) { return p->handle(r); });
  });
  return s;
}

StoreServer::~StoreServer() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

Bytes StoreServer::handle(const Bytes& request) {
  if (request.empty()) return {kBad};
  const Bytes body(request.begin() + 1, request.end());
  WireReader r(body);
  std::string key;
  if (request[0] == kSet) {
    Bytes value;
    if (!r.get_string(&key) || !r.get_vector(&value) || !r.at_end()) return {kBad};
    values_[key] = std::move(value);
    return {kOk};
  }
  if (request[0] == kGet) {
    if (!r.get_string(&key) || !r.at_end()) return {kBad};
    auto it = values_.find(key);
    if (it == values_.end()) return {kMissing};
    Bytes out{kOk};
    out.insert(out.end(), it->second.begin(), it->second.end());
    return out;
  }
  return {kBad};
}

StoreClient::StoreClient(std::string host, int port, double timeout_s)
    : host_(std::move(host)), port_(port), timeout_s_(timeout_s), client_(1000, 1) {}

// One request, repeated until the server answers or the timeout passes (rank 0 may start
// its server after the others start asking).
common::Result<Bytes> StoreClient::call(const Bytes& request) {
  const double deadline = common::now_seconds() + timeout_s_;
  while (true) {
    auto reply = client_.call(host_, port_, request);
    if (reply.ok()) {
      if (reply->empty() || (*reply)[0] == kBad)
        return common::data_loss("the rendezvous store at " + address() +
                                 " refused a request (a different program on that port?)");
      return reply;
    }
    if (common::now_seconds() >= deadline)
      return common::unavailable("no rendezvous store answered at " + address() + " within " +
                                 std::to_string(int(timeout_s_)) + " s (" +
                                 reply.status().message() + "); is rank 0 running there?");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

common::Status StoreClient::set(const std::string& key, const Bytes& value) {
  Bytes request{kSet};
  WireWriter w(&request);
  w.put_string(key);
  w.put_vector(value);
  CP_ASSIGN_OR_RETURN(Bytes reply, call(request));
  (void)reply;
  return {};
}

common::Result<Bytes> StoreClient::get(const std::string& key) {
  Bytes request{kGet};
  WireWriter w(&request);
  w.put_string(key);
  const double deadline = common::now_seconds() + timeout_s_;
  for (int polls = 0;; ++polls) {
    CP_ASSIGN_OR_RETURN(Bytes reply, call(request));
    if (reply[0] == kOk) return Bytes(reply.begin() + 1, reply.end());
    if (common::now_seconds() >= deadline)
      return common::deadline_exceeded("rendezvous: '" + key + "' was not published at " +
                                       address() + " within " + std::to_string(int(timeout_s_)) +
                                       " s (a rank that never started?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(polls < 50 ? 2 : 20));
  }
}

}  // namespace dist
