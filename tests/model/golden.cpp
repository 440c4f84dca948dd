// Golden file loading with a per-process cache.
#include "golden.h"

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace testing_golden {
namespace {

void flatten(const nlohmann::json& rows, std::vector<float>* out) {
  for (const auto& row : rows) {
    for (const auto& v : row) out->push_back(v.get<float>());
  }
}

}  // namespace

const Golden& load_golden(const std::string& model, const std::string& seq) {
  static std::map<std::string, Golden> cache;
  const std::string key = model + "." + seq;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::ifstream in(std::string(CHUNKPIPE_TEST_DATA_DIR) + "/golden/" + key + ".json");
  if (!in) throw std::runtime_error("missing golden file " + key);
  auto j = nlohmann::json::parse(in);
  Golden g;
  g.ids = j["ids"].get<std::vector<int32_t>>();
  g.vocab_size = j["vocab_size"].get<int64_t>();
  flatten(j["all_logits"], &g.all_logits);
  g.last_logits = j["last_logits"].get<std::vector<float>>();
  g.mtp_next_token = j["mtp"]["next_token"].get<int32_t>();
  flatten(j["mtp"]["draft_logits"], &g.draft_logits);
  return cache.emplace(key, std::move(g)).first->second;
}

double max_abs_diff(const float* a, const std::vector<float>& b, int64_t row_begin, int64_t rows,
                    int64_t vocab) {
  double worst = 0;
  for (int64_t i = 0; i < rows * vocab; ++i) {
    const double d = std::abs(double(a[i]) - b[row_begin * vocab + i]);
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

}  // namespace testing_golden
