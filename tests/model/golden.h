// Golden logits files from shared/reference/dsv3_ref.py (copied under tests/data/golden).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace testing_golden {

struct Golden {
  std::vector<int32_t> ids;
  int64_t vocab_size = 0;
  std::vector<float> all_logits;   // [T, V]
  std::vector<float> last_logits;  // [V]
  int32_t mtp_next_token = -1;
  std::vector<float> draft_logits;  // [T, V]
  int64_t num_tokens() const { return static_cast<int64_t>(ids.size()); }
};

// Loads tests/data/golden/<model>.<seq>.json once per process.
const Golden& load_golden(const std::string& model, const std::string& seq);

// max |a - b| over rows [row_begin, row_begin + rows) of b (a holds exactly those rows).
double max_abs_diff(const float* a, const std::vector<float>& b, int64_t row_begin, int64_t rows,
                    int64_t vocab);

}  // namespace testing_golden
