// The pull connector's data: the kv_transfer_params a request carries between P and D (vLLM /
// vllm-ascend field names), what a prefill worker publishes about its KV memory (GET_META),
// the side-channel messages, and the per-step metadata the scheduler side sends its workers.
// Encoders and decoders only; decoders reject malformed bytes, which may come off the network.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "dist/request_channel.h"

namespace transfer {

using dist::Bytes;

// kv_transfer_params as the proxy sends them to P (do_remote_decode) and P's answer carries
// to D (do_remote_prefill and the remote_* fields).
struct PullParams {
  bool do_remote_decode = false;
  bool do_remote_prefill = false;
  std::string remote_engine_id;
  std::string remote_request_id;
  std::string remote_host;
  int remote_port = 0;                    // P's side-channel base port (of its data-parallel rank)
  std::vector<int32_t> remote_block_ids;  // the first KV-cache group's
  int64_t num_prompt_blocks = -1;         // -1: not sent
  int remote_block_size = 0;              // 0: not sent
  int remote_tp_size = 0;                 // remote_ptp_size; 0: from the config
  int remote_pp_size = 0;                 // chunkpipe's addition; 0: from the config
  std::string prompt_hash;                // chunkpipe's addition; empty: not sent
};

// Reads the fields that matter; an absent or null object gives all defaults. Errors name the
// field.
common::Result<PullParams> parse_pull_params(const nlohmann::json& j);
common::Result<PullParams> parse_pull_params(const std::string& text);

// What P answers for a prefilled request whose blocks it keeps for D.
struct Handoff {
  std::string engine_id, request_id, host;
  int port = 0, tp_size = 1, pp_size = 1, block_size = 16;
  std::vector<int32_t> block_ids;  // covering the prompt
  int32_t last_token_id = -1;
  std::string prompt_hash;  // prompt_hash() of the prompt the blocks hold
};
nlohmann::json handoff_json(const Handoff& h);

// A digest of a prompt's token ids (64-bit FNV-1a, hex), which P sends with its blocks so that D
// never takes the KV of another prompt for its own.
std::string prompt_hash(std::span<const int32_t> token_ids);

// GET_META's answer: where one prefill worker's KV lives.
struct AgentMetadata {
  std::string engine_id;
  uint64_t incarnation = 0;  // random per process: tells a restarted worker apart
  Bytes ucx_address;
  int32_t block_size = 0;
  int64_t row_dim = 0;
  int32_t value_bytes = 0;  // 4 (f32 cache) or 2 (bf16)
  int64_t num_blocks = 0;
  int32_t layer_begin = 0, layer_end = 0;  // the worker's decoder layers
  std::vector<uint64_t> layer_base;        // per layer: address of block 0
  std::vector<Bytes> rkeys;                // per layer: its packed UCX key
  int64_t block_bytes() const { return int64_t(block_size) * row_dim * value_bytes; }
};
Bytes encode_metadata(const AgentMetadata& m);
common::Result<AgentMetadata> decode_metadata(const Bytes& bytes);

// Side-channel requests and replies.
enum class SideRequest : uint8_t { kGetMeta = 1, kDone = 2 };
Bytes encode_get_meta();
// token: the sender's own, the same on every resend of this DONE (see LeaseBook).
Bytes encode_done(const std::string& remote_request_id, uint64_t token);
// kind, and for DONE the request id and token; false for anything malformed.
bool decode_side_request(const Bytes& bytes, SideRequest* kind, std::string* request_id,
                         uint64_t* token);
inline const char* kAck = "ACK";
// DONE for a request whose lease had already ended (expired, or released by an earlier DONE):
// its blocks may have been reused, so a read of them cannot be trusted.
inline const char* kExpired = "EXPIRED";

// One load a decoder worker performs: remote_block_ids[i] of P into local_block_ids[i].
struct RecvTask {
  std::string req_id;  // the decoder's
  PullParams remote;
  std::vector<int32_t> remote_block_ids;
  std::vector<int32_t> local_block_ids;
};

// The scheduler side's metadata for one step.
struct PullStepMeta {
  std::vector<std::string> new_leases;  // producer: requests whose blocks wait for a DONE
  std::vector<RecvTask> recvs;          // consumer: loads to start
};
Bytes encode_step_meta(const PullStepMeta& m);
common::Result<PullStepMeta> decode_step_meta(const Bytes& bytes);

// Tells P's worker at host:port that `remote_request_id`'s blocks are no longer needed.
// Ok(true): acknowledged; ok(false): the lease had expired (kExpired).
common::Result<bool> send_done(dist::RequestClient& client, const std::string& host, int port,
                               const std::string& remote_request_id);

// vllm-ascend's handshake port of the worker at (pp_rank, tp_rank) behind a side-channel base
// port.
inline int worker_port(int base_port, int pp_rank, int tp_rank, int tp_size) {
  return base_port + pp_rank * tp_size + tp_rank;
}

}  // namespace transfer
