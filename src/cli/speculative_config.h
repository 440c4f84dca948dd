// --speculative-config: vLLM's SpeculativeConfig JSON for the one method chunkpipe runs, MTP
// with the checkpoint's own layers ("mtp", alias "deepseek_mtp"). Parsing checks the JSON alone;
// the model check needs its config.json (MTP layers present, a DeepSeek model type). Pure.
#pragma once

#include <string>

#include "common/status.h"
#include "model/config.h"

namespace cli {

struct SpeculativeConfig {
  std::string method;  // "mtp" ("deepseek_mtp" is read as "mtp")
  // k drafts per step; 0 when the JSON leaves it out: the model's num_nextn_predict_layers.
  int num_speculative_tokens = 0;
};

common::Result<SpeculativeConfig> parse_speculative_config(const std::string& json_text);

// Resolves k against the model and refuses a model MTP cannot draft for, as vLLM does.
// Returns the warnings to log (k above the MTP layers reuses them).
common::Result<std::string> check_speculative_model(SpeculativeConfig* config,
                                                    const model::ModelConfig& model);

}  // namespace cli
