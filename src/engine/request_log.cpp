// See request_log.h.
#include "engine/request_log.h"

#include <algorithm>
#include <sstream>

#include <nlohmann/json.hpp>

namespace engine {
namespace {

// `text` cut to at most max_len bytes, never inside a UTF-8 character, as a JSON string (any
// byte that is not UTF-8 replaced).
std::string quoted(const std::string& text, int64_t max_len) {
  size_t end = text.size();
  if (max_len >= 0 && end > size_t(max_len)) {
    end = size_t(max_len);
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  }
  return nlohmann::json(text.substr(0, end))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string id_list(std::span<const int32_t> ids, int64_t max_len) {
  const size_t n = max_len >= 0 ? std::min(ids.size(), size_t(max_len)) : ids.size();
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  if (n < ids.size()) s += n ? ", ..." : "...";
  return s + "]";
}

}  // namespace

std::string received_request_line(const std::string& request_id, const std::string& prompt,
                                  std::span<const int32_t> prompt_token_ids,
                                  const sched::SamplingParams& p, int64_t max_log_len) {
  std::ostringstream s;
  s << "Received request " << request_id << ": prompt: " << quoted(prompt, max_log_len)
    << ", params: SamplingParams(temperature=" << p.temperature << ", top_p=" << p.top_p
    << ", top_k=" << p.top_k << ", min_p=" << p.min_p
    << ", seed=" << (p.seed ? std::to_string(*p.seed) : std::string("None"))
    << ", max_tokens=" << p.max_tokens << ", min_tokens=" << p.min_tokens
    << ", ignore_eos=" << (p.ignore_eos ? "True" : "False") << ", stop="
    << nlohmann::json(p.stop).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
    << "), prompt_token_ids: " << id_list(prompt_token_ids, max_log_len) << " ("
    << prompt_token_ids.size() << " tokens)";
  return s.str();
}

std::string generated_response_line(const std::string& request_id, const std::string& output,
                                    std::span<const int32_t> output_token_ids,
                                    const char* finish_reason, int64_t max_log_len) {
  return "Generated response " + request_id + ": output: " + quoted(output, max_log_len) +
         ", output_token_ids: " + id_list(output_token_ids, max_log_len) +
         ", finish_reason: " + (finish_reason ? finish_reason : "None");
}

}  // namespace engine
