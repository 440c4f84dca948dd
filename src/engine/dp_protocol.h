// The messages between a data-parallel front end (DpEngineClient) and its engine processes
// (EngineLink), one kind byte then the payload. The handshake is vLLM's: an engine says HELLO
// on the front end's --data-parallel-rpc-port, gets the addresses it needs (WELCOME: the DP
// group's rendezvous store), loads, and says READY. Then requests go down, outputs and
// periodic STATS come up, and either side's silence past the heartbeat ends the link.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace engine::dp {

enum class Kind : uint8_t {
  kHello = 1,  // engine -> front: rank
  kWelcome,    // front -> engine: dp size, store address
  kReady,      // engine -> front: rank (the model is loaded)
  kOutput,     // engine -> front: encode_output
  kStats,      // engine -> front: encode_metrics (also the engine's heartbeat)
  kFailed,     // engine -> front: why the engine died
  kAdd,        // front -> engine: encode_request
  kAbort,      // front -> engine: request id
  kRelease,    // front -> engine: kv_transfer_params of a request refused before the engine
  kPing,       // front -> engine: the front end's heartbeat
  kShutdown,   // front -> engine
};

struct Welcome {
  int32_t dp_size = 1;
  std::string store_host;  // the DP group's rendezvous store (empty: no group)
  int32_t store_port = 0;
};

std::vector<uint8_t> message(Kind kind, const std::vector<uint8_t>& payload = {});
std::vector<uint8_t> message(Kind kind, const std::string& payload);
// Splits a message; false for an empty one or an unknown kind.
bool parse(const std::vector<uint8_t>& message, Kind* kind, std::vector<uint8_t>* payload);

std::vector<uint8_t> encode_rank(int32_t rank);
common::Result<int32_t> decode_rank(const std::vector<uint8_t>& payload);
std::vector<uint8_t> encode_welcome(const Welcome& welcome);
common::Result<Welcome> decode_welcome(const std::vector<uint8_t>& payload);

}  // namespace engine::dp
