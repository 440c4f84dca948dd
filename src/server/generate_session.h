// GenerateSession: one /v1/completions or /v1/chat/completions request from admission to its
// last byte. Its engine requests (prompts x n choices) report on the engine thread; every event
// is handed to the session's serial queue on the worker pool, which formats SSE chunks or the
// final JSON and queues them on the HttpExchange (never blocking). A client that leaves, or
// falls too far behind, aborts the engine requests; cut() ends it early at shutdown.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/response.h"
#include "api/tool_parser.h"
#include "engine/engine_client.h"
#include "server/http_server.h"
#include "server/parent_request_metrics.h"
#include "server/worker_pool.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/reasoning_parser.h"
#include "tokenizer/tokenizer.h"

namespace server {

struct GenerateChoice {
  std::string engine_id;  // unique per engine request, whatever the client's X-Request-Id
  int64_t prompt_tokens = 0;
  std::vector<int32_t> prompt_token_ids;  // with return_token_ids, or echo with logprobs
  std::string echo;  // until sent (echo): the prompt's text, or chat's final message
  std::unique_ptr<tokenizer::ReasoningParser> reasoning;
  std::unique_ptr<api::ToolCallParser> tools;  // chat with a tool parser and tool_choice != none
  // Filled as outputs arrive.
  std::string text;
  std::string reasoning_text;
  // Echo with logprobs: the echoed prompt's tokens come first.
  std::vector<engine::TokenLogprob> logprobs;
  // RequestOutput's, from the first output.
  std::vector<engine::TokenLogprob> prompt_logprobs;
  bool got_first_output = false;
  size_t chars_sent = 0;           // streamed completions: characters of text sent (text_offset)
  std::vector<int32_t> token_ids;  // with return_token_ids: every generated id
  bool sent_prompt_ids = false;    // streamed completions: the first chunk carries them
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // the prompt's prefix-cache hits, as the engine last reported
  bool finished = false;
  sched::FinishReason finish_reason = sched::FinishReason::kNone;
  nlohmann::json stop_reason = nullptr;
  std::string error;     // the request failed before finishing (engine::RequestOutput::error)
  int error_status = 0;  // engine::RequestOutput::error_status
  std::string kv_transfer_params;  // the KV connector's handoff (JSON), when finished
};

struct GeneratePlan {
  bool chat = false;
  std::string chat_role = "assistant";  // chat: the answer's role
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage = false;  // usage on every chunk (stream_options.continuous_usage_stats)
  bool prompt_tokens_details = false;  // usage.prompt_tokens_details.cached_tokens (a server flag)
  bool want_logprobs = false;
  bool want_prompt_logprobs = false;
  bool echo = false;                     // completions: the prompt leads each choice
  bool echo_without_generation = false;  // completions: the prompt alone is the answer
  bool return_token_ids = false;         // vLLM's: prompt and generated token ids in the response
  bool return_tokens_as_token_ids = false;  // vLLM's: logprobs name tokens "token_id:N"
  int n = 1;
  std::string response_id;
  std::string model_name;
  int64_t created = 0;
  std::vector<GenerateChoice> choices;
  std::vector<engine::EngineRequest> requests;  // one per choice, same order
};

class GenerateSession : public std::enable_shared_from_this<GenerateSession> {
 public:
  // `on_done` runs once, on the serial queue, when the session has nothing more to do.
  // `parent_metrics` (may be null) counts each prompt's choices once they have all finished.
  GenerateSession(engine::EngineClient& engine, const tokenizer::Tokenizer& tokenizer,
                  std::shared_ptr<HttpExchange> exchange, GeneratePlan plan,
                  std::shared_ptr<WorkerPool::Serial> serial,
                  std::function<void(const GenerateSession*)> on_done,
                  std::shared_ptr<ParentRequestMetrics> parent_metrics = nullptr);

  // Submits the engine requests (and the stream's opening chunks). Call once.
  void start();
  // Ends the session now: engine requests are aborted, a stream gets an error event and
  // [DONE], a non-streamed request a 503 with `why`. Thread-safe.
  void cut(const std::string& why);

 private:
  void begin();
  void on_output(size_t index, const engine::RequestOutput& out);
  // Choice `index` finished (on engine `engine_index`): when its prompt's other choices have
  // too, counts them in parent_metrics_.
  void observe_parent_if_finished(size_t index, int engine_index);
  void on_client_gone();
  void abort_unfinished();
  void finish_session();
  bool send_chunk(const nlohmann::json& chunk);
  void send_stream_error(const std::string& message, const char* type, int code);
  void stream_delta(size_t index, const engine::RequestOutput& out, size_t logprobs_before,
                    const tokenizer::ReasoningDelta& delta, const api::ToolParseDelta& tools);
  void send_stream_end();
  void respond_whole();
  api::TokenText token_text() const;
  nlohmann::json logprobs_json(const std::vector<engine::TokenLogprob>& lps,
                               size_t initial_offset = 0) const;
  // The first output's share of an echo with logprobs: the prompt's tokens, its first with no
  // logprob (api::completion_logprobs_json's NaN), ahead of the generated ones.
  void add_echo_logprobs(GenerateChoice& c) const;
  nlohmann::json chunk_envelope(nlohmann::json choices) const;
  // The usage a chunk of choice `index` carries under continuous_usage_stats.
  nlohmann::json chunk_usage(size_t index) const;
  // The request's usage: every prompt once, every choice's tokens.
  nlohmann::json total_usage() const;

  engine::EngineClient& engine_;
  const tokenizer::Tokenizer& tokenizer_;
  const std::shared_ptr<HttpExchange> exchange_;
  GeneratePlan plan_;
  const std::shared_ptr<WorkerPool::Serial> serial_;
  const std::function<void(const GenerateSession*)> on_done_;
  const std::shared_ptr<ParentRequestMetrics> parent_metrics_;
  // Touched only on serial_.
  size_t unfinished_ = 0;
  bool done_ = false;
};

}  // namespace server
