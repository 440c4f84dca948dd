// The text of vLLM's request log lines (--enable-log-requests, --enable-log-outputs): what a
// request asked for when the engine takes it, and what it generated when it finishes. Prompts,
// outputs and token-id lists are cut to max_log_len characters / ids (< 0: whole), at a UTF-8
// character boundary. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "sched/sampling_params.h"

namespace engine {

std::string received_request_line(const std::string& request_id, const std::string& prompt,
                                  std::span<const int32_t> prompt_token_ids,
                                  const sched::SamplingParams& params, int64_t max_log_len);

std::string generated_response_line(const std::string& request_id, const std::string& output,
                                    std::span<const int32_t> output_token_ids,
                                    const char* finish_reason, int64_t max_log_len);

}  // namespace engine
