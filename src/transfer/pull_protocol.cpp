// kv_transfer_params parsing, the handoff JSON, and the pull connector's binary messages.
#include "transfer/pull_protocol.h"

#include <cstdio>
#include <random>

#include "dist/wire.h"

namespace transfer {
namespace {

common::Status bad(const std::string& field, const char* want) {
  return common::invalid_argument("kv_transfer_params." + field + " must be " + want);
}

constexpr uint32_t kMetaMagic = 0x3250434b;  // "KCP2": with value_bytes

}  // namespace

common::Result<PullParams> parse_pull_params(const nlohmann::json& j) {
  PullParams p;
  if (j.is_null()) return p;
  if (!j.is_object()) return common::invalid_argument("kv_transfer_params must be an object");
  auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  auto flag = [&](const char* key, bool* out) -> common::Status {
    if (!present(key)) return {};
    if (!j[key].is_boolean()) return bad(key, "a boolean");
    *out = j[key].get<bool>();
    return {};
  };
  auto text = [&](const char* key, std::string* out) -> common::Status {
    if (!present(key)) return {};
    if (!j[key].is_string()) return bad(key, "a string");
    *out = j[key].get<std::string>();
    return {};
  };
  auto integer = [&](const char* key, int64_t lo, int64_t hi, auto* out) -> common::Status {
    if (!present(key)) return {};
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < lo || j[key].get<int64_t>() > hi)
      return bad(
          key, ("an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]").c_str());
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(j[key].get<int64_t>());
    return {};
  };
  CP_RETURN_IF_ERROR(flag("do_remote_decode", &p.do_remote_decode));
  CP_RETURN_IF_ERROR(flag("do_remote_prefill", &p.do_remote_prefill));
  CP_RETURN_IF_ERROR(text("remote_engine_id", &p.remote_engine_id));
  CP_RETURN_IF_ERROR(text("remote_request_id", &p.remote_request_id));
  CP_RETURN_IF_ERROR(text("remote_host", &p.remote_host));
  CP_RETURN_IF_ERROR(integer("remote_port", 1, 65535, &p.remote_port));
  CP_RETURN_IF_ERROR(integer("num_prompt_blocks", 0, int64_t(1) << 31, &p.num_prompt_blocks));
  CP_RETURN_IF_ERROR(integer("remote_block_size", 1, 1 << 20, &p.remote_block_size));
  CP_RETURN_IF_ERROR(text("prompt_hash", &p.prompt_hash));
  CP_RETURN_IF_ERROR(integer("remote_ptp_size", 1, 4096, &p.remote_tp_size));
  CP_RETURN_IF_ERROR(integer("remote_pp_size", 1, 4096, &p.remote_pp_size));
  if (present("remote_block_ids")) {
    // One list per KV-cache group (vLLM >= 0.11), or the older flat list.
    const nlohmann::json* ids = &j["remote_block_ids"];
    if (ids->is_array() && !ids->empty() && (*ids)[0].is_array()) ids = &(*ids)[0];
    if (!ids->is_array()) return bad("remote_block_ids", "a list of block ids");
    for (const auto& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        return bad("remote_block_ids", "a list of non-negative block ids");
      p.remote_block_ids.push_back(id.get<int32_t>());
    }
  }
  if (p.do_remote_prefill) {
    if (p.remote_host.empty() || p.remote_port == 0 || p.remote_request_id.empty())
      return common::invalid_argument(
          "kv_transfer_params with do_remote_prefill needs remote_host, remote_port and "
          "remote_request_id");
  }
  return p;
}

common::Result<PullParams> parse_pull_params(const std::string& text) {
  if (text.empty()) return PullParams{};
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return common::invalid_argument("kv_transfer_params is not JSON");
  return parse_pull_params(j);
}

nlohmann::json handoff_json(const Handoff& h) {
  return {{"do_remote_prefill", true},
          {"do_remote_decode", false},
          {"remote_block_ids", nlohmann::json::array({h.block_ids})},
          {"remote_engine_id", h.engine_id},
          {"remote_request_id", h.request_id},
          {"remote_host", h.host},
          {"remote_port", h.port},
          {"remote_pcp_size", 1},
          {"remote_dcp_size", 1},
          {"remote_ptp_size", h.tp_size},
          {"remote_pp_size", h.pp_size},
          {"last_token_id", h.last_token_id},
          {"num_prompt_blocks", h.block_ids.size()},
          {"remote_block_size", h.block_size},
          {"prompt_hash", h.prompt_hash}};
}

std::string prompt_hash(std::span<const int32_t> token_ids) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a over the ids' little-endian bytes
  for (int32_t id : token_ids) {
    auto u = static_cast<uint32_t>(id);
    for (int b = 0; b < 4; ++b, u >>= 8) {
      h ^= u & 0xff;
      h *= 1099511628211ull;
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

Bytes encode_metadata(const AgentMetadata& m) {
  Bytes out;
  dist::WireWriter w(&out);
  w.put(kMetaMagic);
  w.put_string(m.engine_id);
  w.put(m.incarnation);
  w.put_vector(m.ucx_address);
  w.put(m.block_size);
  w.put(m.row_dim);
  w.put(m.value_bytes);
  w.put(m.num_blocks);
  w.put(m.layer_begin);
  w.put(m.layer_end);
  w.put_vector(m.layer_base);
  w.put<uint64_t>(m.rkeys.size());
  for (const Bytes& k : m.rkeys) w.put_vector(k);
  return out;
}

common::Result<AgentMetadata> decode_metadata(const Bytes& bytes) {
  AgentMetadata m;
  dist::WireReader r(bytes);
  uint32_t magic = 0;
  uint64_t num_keys = 0;
  r.get(&magic);
  r.get_string(&m.engine_id);
  r.get(&m.incarnation);
  r.get_vector(&m.ucx_address);
  r.get(&m.block_size);
  r.get(&m.row_dim);
  r.get(&m.value_bytes);
  r.get(&m.num_blocks);
  r.get(&m.layer_begin);
  r.get(&m.layer_end);
  r.get_vector(&m.layer_base);
  if (!r.get(&num_keys) || magic != kMetaMagic || num_keys > bytes.size())
    return common::data_loss("malformed KV agent metadata");
  m.rkeys.resize(num_keys);
  for (Bytes& k : m.rkeys) r.get_vector(&k);
  const int64_t layers = int64_t(m.layer_end) - m.layer_begin;
  if (!r.ok() || !r.at_end() || layers < 0 || int64_t(m.layer_base.size()) != layers ||
      int64_t(m.rkeys.size()) != layers || m.block_size <= 0 || m.row_dim <= 0 ||
      (m.value_bytes != 2 && m.value_bytes != 4) || m.num_blocks < 0)
    return common::data_loss("malformed KV agent metadata");
  return m;
}

Bytes encode_get_meta() {
  return {static_cast<uint8_t>(SideRequest::kGetMeta)};
}

Bytes encode_done(const std::string& remote_request_id, uint64_t token) {
  Bytes out{static_cast<uint8_t>(SideRequest::kDone)};
  dist::WireWriter w(&out);
  w.put_string(remote_request_id);
  w.put(token);
  return out;
}

bool decode_side_request(const Bytes& bytes, SideRequest* kind, std::string* request_id,
                         uint64_t* token) {
  if (bytes.empty()) return false;
  if (bytes[0] == static_cast<uint8_t>(SideRequest::kGetMeta)) {
    *kind = SideRequest::kGetMeta;
    return bytes.size() == 1;
  }
  if (bytes[0] != static_cast<uint8_t>(SideRequest::kDone)) return false;
  *kind = SideRequest::kDone;
  const Bytes rest(bytes.begin() + 1, bytes.end());
  dist::WireReader r(rest);
  return r.get_string(request_id) && r.get(token) && r.at_end();
}

Bytes encode_step_meta(const PullStepMeta& m) {
  Bytes out;
  dist::WireWriter w(&out);
  w.put_strings(m.new_leases);
  w.put<uint64_t>(m.recvs.size());
  for (const RecvTask& t : m.recvs) {
    w.put_string(t.req_id);
    w.put_string(t.remote.remote_engine_id);
    w.put_string(t.remote.remote_request_id);
    w.put_string(t.remote.remote_host);
    w.put<int32_t>(t.remote.remote_port);
    w.put<int32_t>(t.remote.remote_tp_size);
    w.put<int32_t>(t.remote.remote_pp_size);
    w.put_vector(t.remote_block_ids);
    w.put_vector(t.local_block_ids);
  }
  return out;
}

common::Result<PullStepMeta> decode_step_meta(const Bytes& bytes) {
  PullStepMeta m;
  if (bytes.empty()) return m;
  dist::WireReader r(bytes);
  uint64_t n = 0;
  if (!r.get_strings(&m.new_leases) || !r.get(&n) || n > bytes.size())
    return common::data_loss("malformed pull connector metadata");
  m.recvs.resize(n);
  for (RecvTask& t : m.recvs) {
    int32_t port = 0, tp = 0, pp = 0;
    r.get_string(&t.req_id);
    r.get_string(&t.remote.remote_engine_id);
    r.get_string(&t.remote.remote_request_id);
    r.get_string(&t.remote.remote_host);
    r.get(&port);
    r.get(&tp);
    r.get(&pp);
    r.get_vector(&t.remote_block_ids);
    r.get_vector(&t.local_block_ids);
    t.remote.remote_port = port;
    t.remote.remote_tp_size = tp;
    t.remote.remote_pp_size = pp;
    if (t.remote_block_ids.size() != t.local_block_ids.size() || tp < 1 || pp < 1)
      return common::data_loss("malformed pull connector metadata");
  }
  if (!r.ok() || !r.at_end()) return common::data_loss("malformed pull connector metadata");
  return m;
}

common::Result<bool> send_done(dist::RequestClient& client, const std::string& host, int port,
                               const std::string& remote_request_id) {
  // One token per DONE: the client's own resends (after a reply that came too late) carry it.
  static thread_local std::mt19937_64 rng(std::random_device{}() ^
                                          (uint64_t(std::random_device{}()) << 32));
  CP_ASSIGN_OR_RETURN(Bytes reply, client.call(host, port, encode_done(remote_request_id, rng())));
  const std::string text(reply.begin(), reply.end());
  if (text == kAck) return true;
  if (text == kExpired) return false;
  return common::data_loss("KV side channel " + host + ":" + std::to_string(port) +
                           " answered DONE with '" + text.substr(0, 32) + "'");
}

}  // namespace transfer
