// Status and Result<T>: the return types of every operation that can fail for expected reasons
// (bad input, missing files, capacity). Value types; thread-compatible. A Status is either OK or
// carries a code and a one-line message that names the offending thing.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "common/check.h"

namespace common {

enum class StatusCode {
  kOk,
  kInvalidArgument,
  kNotFound,
  kDataLoss,
  kUnimplemented,
  kInternal,
  kUnavailable,       // a peer is gone or does not answer
  kDeadlineExceeded,  // a wait ran past its timeout
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string msg) {
  return {StatusCode::kInvalidArgument, std::move(msg)};
}
inline Status not_found(std::string msg) {
  return {StatusCode::kNotFound, std::move(msg)};
}
inline Status data_loss(std::string msg) {
  return {StatusCode::kDataLoss, std::move(msg)};
}
inline Status unimplemented(std::string msg) {
  return {StatusCode::kUnimplemented, std::move(msg)};
}
inline Status unavailable(std::string msg) {
  return {StatusCode::kUnavailable, std::move(msg)};
}
inline Status deadline_exceeded(std::string msg) {
  return {StatusCode::kDeadlineExceeded, std::move(msg)};
}

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {  // NOLINT: implicit by design
    CHECK(!std::get<Status>(data_).ok()) << "Result built from an OK status";
  }

  bool ok() const { return std::holds_alternative<T>(data_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(data_);
  }
  T& value() & {
    CHECK(ok()) << status().message();
    return std::get<T>(data_);
  }
  const T& value() const& {
    CHECK(ok()) << status().message();
    return std::get<T>(data_);
  }
  T&& value() && {
    CHECK(ok()) << status().message();
    return std::get<T>(std::move(data_));
  }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace common

// Propagates a non-OK Status from an expression returning Status.
#define CP_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::common::Status cp_status_ = (expr);    \
    if (!cp_status_.ok()) return cp_status_; \
  } while (0)

#define CP_CONCAT_INNER(a, b) a##b
#define CP_CONCAT(a, b) CP_CONCAT_INNER(a, b)
// Declares `lhs` from a Result-returning expression, or returns its Status.
#define CP_ASSIGN_OR_RETURN(lhs, expr) \
  CP_ASSIGN_OR_RETURN_IMPL(CP_CONCAT(cp_result_, __LINE__), lhs, expr)
#define CP_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
