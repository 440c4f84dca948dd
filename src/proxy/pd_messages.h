// The bodies the PD proxy sends to P and D, and its reading and rewriting of their answers:
// the prefill leg's body, choice 0's text and token ids (kept for a recompute round), usage
// rebased onto the client's prompt and earlier rounds, the token-id fields the proxy asked for
// but the client did not, and the request of the next round. Pure functions over JSON: an answer
// of any shape, from any backend, never throws here. Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace proxy {

// Untrusted JSON (a client's body, a backend's answer) parsed under api's nesting bound;
// `discarded` when it is not JSON.
nlohmann::json parse_bounded(const std::string& text);

// A request field as the backends read it, with pydantic's lax conversions ("stream": "true"
// streams there, so the relay must expect a stream too). An integer field is converted only
// when `lax` (a client's body, not a backend's answer); nullopt when missing or not an int64.
bool flag(const nlohmann::json& body, const char* key);
std::optional<int64_t> integer(const nlohmann::json& obj, const char* key, bool lax = true);

// The body P gets: one token, no stream, and the instruction to keep the KV for a decoder.
nlohmann::json prefill_body(const nlohmann::json& request);

// The request of the next round after a decoder handed a request back with `generated_ids`
// made: a completion of the prompt's and those exact ids (a chat request keeps every field
// that means the same to a completion), with max_tokens and min_tokens less what was made.
nlohmann::json next_round_request(const nlohmann::json& original, const nlohmann::json& current,
                                  bool chat, const std::vector<int32_t>& prompt_ids,
                                  const std::vector<int32_t>& generated_ids, int64_t max_tokens);

// What a leg's answer (a whole response or one stream chunk) says about choice 0.
struct ChoiceDelta {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<int32_t> prompt_token_ids;
  bool recomputed = false;  // stop_reason "recomputed": the decoder handed the request back
};
ChoiceDelta read_choice(const nlohmann::json& answer, bool chat, bool stream);

// What earlier rounds of a request (before decoders handed it back) produced.
struct EarlierRounds {
  int64_t prompt_tokens = -1;  // the client's prompt, from P's first answer; -1 unknown
  std::string text;
  std::vector<int32_t> token_ids;
};

// One event of a decoder's stream, as the client should get it.
struct RelayedEvent {
  enum class Kind {
    kDone,        // [DONE]: the proxy sends its own once the last round is over
    kAsIs,        // not a chunk the proxy reads (not JSON, or an error): relayed unchanged
    kRecomputed,  // the decoder handed the request back: hidden from the client
    kEmpty,       // only the token ids the client did not ask for: dropped
    kChunk,       // `data` holds the rewritten event
  };
  Kind kind = Kind::kAsIs;
  std::string data;    // kChunk: the event to send
  ChoiceDelta choice;  // kRecomputed, kEmpty, kChunk: what the chunk said
};
RelayedEvent relay_stream_event(const std::string& event, bool chat, bool wants_ids,
                                const EarlierRounds& earlier);

// A decoder's whole (non-stream) answer, rewritten in place as the client's: earlier rounds'
// text and ids come first, usage is rebased, and token ids the client did not ask for are null.
void finish_whole_answer(nlohmann::json* answer, bool chat, bool wants_ids,
                         const EarlierRounds& earlier);

}  // namespace proxy
