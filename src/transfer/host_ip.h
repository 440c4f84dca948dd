// This host's address as peers should dial it, the way vLLM's get_ip() chooses: VLLM_HOST_IP
// when set, else the source address of the default route, else 127.0.0.1. Thread-safe.
#pragma once

#include <string>

namespace transfer {

std::string host_ip();

}  // namespace transfer
