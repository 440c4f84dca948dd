// Layouts of the data-parallel link's messages (dist/wire.h primitives).
#include "engine/dp_protocol.h"

#include "dist/wire.h"

namespace engine::dp {

std::vector<uint8_t> message(Kind kind, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out;
  out.reserve(payload.size() + 1);
  out.push_back(static_cast<uint8_t>(kind));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<uint8_t> message(Kind kind, const std::string& payload) {
  return message(kind, std::vector<uint8_t>(payload.begin(), payload.end()));
}

bool parse(const std::vector<uint8_t>& m, Kind* kind, std::vector<uint8_t>* payload) {
  if (m.empty() || m[0] < static_cast<uint8_t>(Kind::kHello) ||
      m[0] > static_cast<uint8_t>(Kind::kShutdown))
    return false;
  *kind = static_cast<Kind>(m[0]);
  payload->assign(m.begin() + 1, m.end());
  return true;
}

std::vector<uint8_t> encode_rank(int32_t rank) {
  std::vector<uint8_t> out;
  dist::WireWriter(&out).put(rank);
  return out;
}

common::Result<int32_t> decode_rank(const std::vector<uint8_t>& payload) {
  dist::WireReader r(payload);
  int32_t rank = -1;
  if (!r.get(&rank) || !r.at_end() || rank < 0)
    return common::data_loss("a malformed data-parallel rank message");
  return rank;
}

std::vector<uint8_t> encode_welcome(const Welcome& w) {
  std::vector<uint8_t> out;
  dist::WireWriter wr(&out);
  wr.put(w.dp_size);
  wr.put_string(w.store_host);
  wr.put(w.store_port);
  return out;
}

common::Result<Welcome> decode_welcome(const std::vector<uint8_t>& payload) {
  Welcome w;
  dist::WireReader r(payload);
  r.get(&w.dp_size);
  r.get_string(&w.store_host);
  r.get(&w.store_port);
  if (!r.ok() || !r.at_end() || w.dp_size < 1)
    return common::data_loss("a malformed data-parallel WELCOME");
  return w;
}

}  // namespace engine::dp
