// Status formatting.
#include "common/status.h"

namespace common {

std::string Status::to_string() const {
  const char* name = "OK";
  switch (code_) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      name = "invalid argument";
      break;
    case StatusCode::kNotFound:
      name = "not found";
      break;
    case StatusCode::kDataLoss:
      name = "data loss";
      break;
    case StatusCode::kUnimplemented:
      name = "unimplemented";
      break;
    case StatusCode::kInternal:
      name = "internal";
      break;
    case StatusCode::kUnavailable:
      name = "unavailable";
      break;
    case StatusCode::kDeadlineExceeded:
      name = "deadline exceeded";
      break;
  }
  return std::string(name) + ": " + message_;
}

}  // namespace common
