// CHECK(cond) << "message": aborts with file:line when an internal invariant is broken.
// Only for programmer errors; user input must be validated and reported through Status.
// Thread-safe (writes one line to stderr, then aborts).
#pragma once

#include <sstream>

namespace common::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

// Lets `CHECK(x) << msg` be an expression of type void.
struct Voidify {
  void operator&(CheckFailure&) {}
};

}  // namespace common::internal

#define CHECK(cond)                        \
  (cond) ? (void)0                         \
         : ::common::internal::Voidify() & \
               ::common::internal::CheckFailure(__FILE__, __LINE__, #cond)

#ifdef NDEBUG
#define DCHECK(cond) \
  while (false) CHECK(cond)
#else
#define DCHECK(cond) CHECK(cond)
#endif
