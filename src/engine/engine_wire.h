// The EngineClient's messages on the wire: EngineRequest, RequestOutput and metrics as bytes, for
// an engine in another process or behind a data-parallel client. Pure functions; decoding checks
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

// A metrics snapshot (an engine's periodic report to a data-parallel front end).
std::vector<uint8_t> encode_metrics(const MetricsSnapshot& snapshot);
common::Result<MetricsSnapshot> decode_metrics(const std::vector<uint8_t>& bytes);

}  // namespace engine
