// Prometheus text exposition of the engine's metrics with vLLM's names, types and labels
// (model_name, engine). Pure function; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "engine/metrics.h"
#include "server/parent_request_metrics.h"

namespace server {

// One sample per engine (label engine="i") in each family; `parents` (may be null) adds the
// per-parent-request histograms.
std::string render_metrics(const std::vector<engine::EngineMetrics>& engines,
                           const std::string& model_name,
                           const ParentRequestMetrics* parents = nullptr);

}  // namespace server
