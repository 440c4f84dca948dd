// The EngineClient's messages on the wire: EngineRequest and RequestOutput as bytes, for an
// engine in another process or behind a data-parallel client. Pure functions; decoding checks
// every length and refuses trailing bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "engine/engine_client.h"

namespace engine {

std::vector<uint8_t> encode_request(const EngineRequest& request);
common::Result<EngineRequest> decode_request(const std::vector<uint8_t>& bytes);

std::vector<uint8_t> encode_output(const RequestOutput& output);
common::Result<RequestOutput> decode_output(const std::vector<uint8_t>& bytes);

}  // namespace engine
