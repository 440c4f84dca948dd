// Fuzz target: what reaches a PD connector from outside the process: a side-channel request (a
// decoder's GET_META or DONE on P's kv_port, from the network), the agent metadata P answers
// with, a step's connector metadata, and a client's kv_transfer_params. Each decoder succeeds or
// fails cleanly; a DONE that decodes encodes back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "transfer/pull_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const transfer::Bytes bytes(data, data + size);
  transfer::SideRequest kind{};
  std::string request_id;
  uint64_t token = 0;
  if (transfer::decode_side_request(bytes, &kind, &request_id, &token) &&
      kind == transfer::SideRequest::kDone && transfer::encode_done(request_id, token) != bytes)
    __builtin_trap();
  (void)transfer::decode_metadata(bytes);
  (void)transfer::decode_step_meta(bytes);
  (void)transfer::parse_pull_params(std::string(bytes.begin(), bytes.end()));
  return 0;
}
