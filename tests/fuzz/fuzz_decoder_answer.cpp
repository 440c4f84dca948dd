// Fuzz target: what a decoder (or prefiller) sends back through the PD proxy. The bytes go
// through the SSE splitter in reads of varying size and each event through the stream relay;
// the whole text is also read as a non-stream answer, a prefiller's answer and a next round's
// request. Nothing may crash or throw, every event the splitter yields ends with a blank line,
// and every rewritten chunk is JSON again.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "proxy/pd_messages.h"
#include "proxy/sse_splitter.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const bool chat = data[0] & 1, wants_ids = data[0] & 2;
  const size_t read_size = 1 + data[1] % 64;
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);

  proxy::EarlierRounds earlier;
  earlier.prompt_tokens = (data[0] & 4) ? 5 : -1;
  if (data[0] & 8) {
    earlier.text = "earlier ";
    earlier.token_ids = {1, 2, 3};
  }
  proxy::SseSplitter splitter;
  size_t events_bytes = 0;
  for (size_t at = 0; at < text.size(); at += read_size) {
    for (const std::string& event : splitter.push(std::string_view(text).substr(at, read_size))) {
      events_bytes += event.size();
      const std::string_view ev(event);
      if (!(ev.size() >= 2 && ev.substr(ev.size() - 2) == "\n\n") &&
          !(ev.size() >= 4 && ev.substr(ev.size() - 4) == "\r\n\r\n"))
        __builtin_trap();
      const proxy::RelayedEvent e = proxy::relay_stream_event(event, chat, wants_ids, earlier);
      if (e.kind == proxy::RelayedEvent::Kind::kChunk &&
          !proxy::parse_bounded(proxy::sse_data(e.data)).is_object())
        __builtin_trap();
    }
  }
  if (events_bytes + splitter.rest().size() != text.size()) __builtin_trap();

  nlohmann::json answer = proxy::parse_bounded(text);
  if (answer.is_discarded()) return 0;
  (void)proxy::read_choice(answer, chat, /*stream=*/false);
  (void)proxy::integer(answer, "max_tokens");
  (void)proxy::flag(answer, "stream");
  if (answer.is_object()) {
    (void)proxy::prefill_body(answer).dump();
    (void)proxy::next_round_request(answer, answer, chat, {1}, earlier.token_ids, 4).dump();
  }
  proxy::finish_whole_answer(&answer, chat, wants_ids, earlier);
  (void)answer.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return 0;
}
