// This host's address as peers should dial it, the way vLLM's get_ip() chooses: VLLM_HOST_IP
// when set, else the source address of the route toward `toward` (the default route for a
// public address), else 127.0.0.1. Thread-safe.
#pragma once

#include <string>

namespace dist {

std::string host_ip(const std::string& toward = "8.8.8.8");

}  // namespace dist
