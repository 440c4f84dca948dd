// Small synchronous JSON-over-HTTP calls for the benchmark's set-up (model discovery, prompt
// alignment through /tokenize and /detokenize). libcurl easy interface; thread-compatible.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace httpclient {

// GET when body is empty, else POST. Non-200 answers are errors naming the status and body.
common::Result<nlohmann::json> http_json(const std::string& url, const std::string& body,
                                         const std::vector<std::string>& headers);

}  // namespace httpclient
