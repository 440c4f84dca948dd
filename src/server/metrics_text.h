// Prometheus text exposition of the engine's metrics with vLLM's names, types and labels
// (model_name, engine). Pure function; thread-safe.
#pragma once

#include <string>

#include "engine/metrics.h"

namespace server {

std::string render_metrics(const engine::MetricsSnapshot& snapshot, const std::string& model_name);

}  // namespace server
