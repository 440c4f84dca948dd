// Status / Result behaviour and the error-propagation macros.
#include "common/status.h"

#include <gtest/gtest.h>

namespace {

common::Result<int> parse_positive(int v) {
  if (v <= 0) return common::invalid_argument("value " + std::to_string(v) + " is not positive");
  return v;
}

common::Result<int> doubled(int v) {
  CP_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

common::Status check_both(int a, int b) {
  CP_RETURN_IF_ERROR(parse_positive(a).status());
  CP_RETURN_IF_ERROR(parse_positive(b).status());
  return {};
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(common::Status().ok());
  common::Status s = common::not_found("x.safetensors: tensor 'a' is missing");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), common::StatusCode::kNotFound);
  EXPECT_EQ(s.to_string(), "not found: x.safetensors: tensor 'a' is missing");
}

TEST(StatusTest, ResultPropagation) {
  EXPECT_EQ(doubled(21).value(), 42);
  auto bad = doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "value -1 is not positive");
  EXPECT_TRUE(check_both(1, 2).ok());
  EXPECT_EQ(check_both(1, 0).message(), "value 0 is not positive");
}

}  // namespace
