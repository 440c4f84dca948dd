// Session bookkeeping and the OpenAI response shapes (vLLM's field order and nulls): the
// whole completion / chat.completion object, and the streamed chunks.
#include "server/generate_session.h"

#include <limits>

#include "api/protocol.h"
#include "api/response.h"

namespace server {
namespace {

using nlohmann::json;

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// How a failed choice is reported (engine::RequestOutput::error_status).
struct ErrorKind {
  int status;
  const char* type;
};
ErrorKind error_kind(int error_status) {
  if (error_status == 400) return {400, "BadRequestError"};
  if (error_status != 0) return {error_status, "InternalServerError"};
  return {500, "EngineDeadError"};
}

}  // namespace

GenerateSession::GenerateSession(engine::EngineClient& engine,
                                 const tokenizer::Tokenizer& tokenizer,
                                 std::shared_ptr<HttpExchange> exchange, GeneratePlan plan,
                                 std::shared_ptr<WorkerPool::Serial> serial,
                                 std::function<void(const GenerateSession*)> on_done,
                                 std::shared_ptr<ParentRequestMetrics> parent_metrics)
    : engine_(engine),
      tokenizer_(tokenizer),
      exchange_(std::move(exchange)),
      plan_(std::move(plan)),
      serial_(std::move(serial)),
      on_done_(std::move(on_done)),
      parent_metrics_(std::move(parent_metrics)) {}

void GenerateSession::start() {
  serial_->post([self = shared_from_this()] { self->begin(); });
}

void GenerateSession::cut(const std::string& why) {
  serial_->post([self = shared_from_this(), why] {
    if (self->done_) return;
    self->abort_unfinished();
    if (self->plan_.stream) {
      self->send_stream_error(why, "ServiceUnavailableError", 503);
    } else {
      HttpResponse r;
      r.status = 503;
      r.body = dump(api::ApiError{503, why, "ServiceUnavailableError"}.body());
      self->exchange_->respond(std::move(r));
    }
    self->finish_session();
  });
}

void GenerateSession::begin() {
  std::weak_ptr<GenerateSession> weak = weak_from_this();
  exchange_->on_close([weak] {
    if (auto self = weak.lock()) {
      self->serial_->post([self] { self->on_client_gone(); });
    }
  });
  if (plan_.stream) {
    HttpHeaders headers = {{"Cache-Control", "no-cache"}};  // X-Request-Id: ApiServer's
    exchange_->start_stream(200, "text/event-stream; charset=utf-8", std::move(headers));
    if (plan_.chat) {
      json choices = json::array();
      for (size_t i = 0; i < plan_.choices.size(); ++i) {
        choices.push_back({{"index", i},
                           {"delta", {{"role", plan_.chat_role}, {"content", ""}}},
                           {"logprobs", nullptr},
                           {"finish_reason", nullptr}});
      }
      for (size_t i = 0; i < choices.size(); ++i) {
        json chunk = chunk_envelope(json::array({choices[i]}));
        if (plan_.continuous_usage) chunk["usage"] = chunk_usage(i);
        // vLLM's return_token_ids: the stream's first chunk carries the prompt's ids.
        if (plan_.return_token_ids && i == 0)
          chunk["prompt_token_ids"] = plan_.choices[0].prompt_token_ids;
        send_chunk(chunk);
      }
      // Chat echo: the final message comes before anything generated, a chunk per choice.
      for (size_t i = 0; i < plan_.choices.size(); ++i) {
        std::string& echo = plan_.choices[i].echo;
        if (echo.empty()) continue;
        json chunk = chunk_envelope(json::array({{{"index", i},
                                                  {"delta", {{"content", echo}}},
                                                  {"logprobs", nullptr},
                                                  {"finish_reason", nullptr}}}));
        if (plan_.continuous_usage) chunk["usage"] = chunk_usage(i);
        send_chunk(chunk);
        echo.clear();
      }
    }
  }
  unfinished_ = plan_.choices.size();
  auto requests = std::move(plan_.requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    // The callback keeps the session alive until the engine reports the request finished.
    engine_.add_request(std::move(requests[i]),
                        [self = shared_from_this(), i](const engine::RequestOutput& out) {
                          self->serial_->post([self, i, out] { self->on_output(i, out); });
                        });
  }
}

void GenerateSession::abort_unfinished() {
  for (const auto& c : plan_.choices) {
    if (!c.finished) engine_.abort_request(c.engine_id);
  }
}

void GenerateSession::finish_session() {
  if (done_) return;
  done_ = true;
  if (on_done_) on_done_(this);
}

void GenerateSession::on_client_gone() {
  if (done_) return;
  abort_unfinished();
  finish_session();
}

json GenerateSession::chunk_envelope(json choices) const {
  return api::chunk_envelope(plan_.response_id, plan_.chat, plan_.created, plan_.model_name,
                             std::move(choices));
}

bool GenerateSession::send_chunk(const json& chunk) {
  return exchange_->send("data: " + dump(chunk) + "\n\n");
}

void GenerateSession::send_stream_error(const std::string& message, const char* type, int code) {
  exchange_->send("data: " + dump(api::ApiError{code, message, type}.body()) + "\n\n");
  exchange_->send("data: [DONE]\n\n");
  exchange_->end_stream();
}

api::TokenText GenerateSession::token_text() const {
  return [this](int32_t id) { return tokenizer::sanitize_utf8(tokenizer_.token_bytes(id)); };
}

json GenerateSession::logprobs_json(const std::vector<engine::TokenLogprob>& lps,
                                    size_t initial_offset) const {
  if (lps.empty() && !plan_.want_logprobs) return nullptr;
  api::TokenText text = token_text();
  if (plan_.return_tokens_as_token_ids)
    text = [](int32_t id) { return "token_id:" + std::to_string(id); };
  return plan_.chat ? api::chat_logprobs_json(lps, text)
                    : api::completion_logprobs_json(lps, text, initial_offset);
}

void GenerateSession::add_echo_logprobs(GenerateChoice& c) const {
  if (c.prompt_token_ids.empty()) return;
  std::vector<engine::TokenLogprob> echoed(1);
  echoed[0].token = c.prompt_token_ids[0];
  echoed[0].logprob = std::numeric_limits<float>::quiet_NaN();
  echoed.insert(echoed.end(), c.prompt_logprobs.begin(), c.prompt_logprobs.end());
  c.logprobs.insert(c.logprobs.begin(), echoed.begin(), echoed.end());
}

void GenerateSession::observe_parent_if_finished(size_t index, int engine_index) {
  if (parent_metrics_ == nullptr) return;
  const size_t n = static_cast<size_t>(std::max(plan_.n, 1));
  const size_t first = index / n * n;  // choices are prompt-major: n per prompt
  int64_t most = 0;
  for (size_t i = first; i < first + n && i < plan_.choices.size(); ++i) {
    if (!plan_.choices[i].finished) return;
    most = std::max(most, plan_.choices[i].completion_tokens);
  }
  parent_metrics_->observe(engine_index, plan_.n, most);
}

void GenerateSession::on_output(size_t index, const engine::RequestOutput& o) {
  GenerateChoice& c = plan_.choices[index];
  if (c.finished) return;
  if (o.finished) {
    c.finished = true;
    c.completion_tokens = o.num_output_tokens;
    --unfinished_;
    observe_parent_if_finished(index, o.engine_index);
  }
  if (done_) return;  // the client left or the session was cut: only bookkeeping
  // Text: reasoning split first, then tool-call markup in the content.
  tokenizer::ReasoningDelta d;
  if (c.reasoning) {
    d = c.reasoning->push(o.new_text);
    if (o.finished) {
      auto tail = c.reasoning->flush();
      d.reasoning += tail.reasoning;
      d.content += tail.content;
    }
  } else if (!plan_.echo_without_generation) {
    d.content = o.new_text;
  }
  api::ToolParseDelta tools;
  if (c.tools) {
    tools = c.tools->push(d.content);
    if (o.finished) {
      api::ToolParseDelta tail = c.tools->flush();
      tools.content += tail.content;
      for (auto& call : tail.calls) {
        if (!tools.calls.empty() && tools.calls.back().index == call.index && !call.first) {
          tools.calls.back().arguments += call.arguments;
        } else {
          tools.calls.push_back(std::move(call));
        }
      }
    }
    d.content = tools.content;
  }
  c.text += d.content;
  c.reasoning_text += d.reasoning;
  if (plan_.return_token_ids)
    c.token_ids.insert(c.token_ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
  if (o.num_cached_tokens > 0) c.cached_tokens = o.num_cached_tokens;
  c.completion_tokens = o.finished
                            ? o.num_output_tokens
                            : c.completion_tokens + static_cast<int64_t>(o.new_token_ids.size());
  const size_t lp_before = c.logprobs.size();
  if (!c.got_first_output) {
    c.got_first_output = true;
    c.prompt_logprobs = o.prompt_logprobs;
    if (plan_.want_logprobs && plan_.echo) add_echo_logprobs(c);
  }
  if (plan_.want_logprobs && !plan_.echo_without_generation)
    c.logprobs.insert(c.logprobs.end(), o.new_logprobs.begin(), o.new_logprobs.end());
  if (o.finished) {
    c.kv_transfer_params = o.kv_transfer_params;
    c.finish_reason = o.finish_reason;
    c.stop_reason = api::stop_reason_json(o.stop_reason);
    c.error = o.error;
    c.error_status = o.error_status;
  }

  if (plan_.stream) {
    if (!c.error.empty()) {  // vLLM streams the error as a data event, then [DONE]
      abort_unfinished();
      const ErrorKind kind = error_kind(c.error_status);
      send_stream_error(c.error, kind.type, kind.status);
      return finish_session();
    }
    stream_delta(index, o, lp_before, d, tools);
    if (unfinished_ == 0) send_stream_end();
    if (exchange_->closed()) on_client_gone();
    return;
  }
  if (unfinished_ == 0) respond_whole();
}

void GenerateSession::stream_delta(size_t index, const engine::RequestOutput& o,
                                   size_t logprobs_before, const tokenizer::ReasoningDelta& d,
                                   const api::ToolParseDelta& tools) {
  GenerateChoice& c = plan_.choices[index];
  std::vector<engine::TokenLogprob> new_lps(c.logprobs.begin() + logprobs_before, c.logprobs.end());
  json lps = new_lps.empty() ? json(nullptr) : logprobs_json(new_lps, c.chars_sent);
  json reason = nullptr;
  if (o.finished) {
    const char* fr = sched::finish_reason_name(c.finish_reason);
    if (fr) reason = fr;
    if (c.tools && !c.tools->calls().empty() && c.finish_reason != sched::FinishReason::kAbort)
      reason = "tool_calls";  // as vLLM: whenever the parser found calls
  }
  json choice;
  if (plan_.chat) {
    json delta = json::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!tools.calls.empty()) {
      json calls = json::array();
      for (const auto& t : tools.calls) calls.push_back(api::tool_delta_json(t));
      delta["tool_calls"] = calls;
    }
    const bool ids = plan_.return_token_ids && !o.new_token_ids.empty();
    if (delta.empty() && new_lps.empty() && !ids && !o.finished) return;  // no empty deltas
    if (delta.empty()) delta["content"] = "";
    choice = {{"index", index}, {"delta", delta}, {"logprobs", lps}, {"finish_reason", reason}};
    if (o.finished) choice["stop_reason"] = c.stop_reason;
    if (plan_.return_token_ids) choice["token_ids"] = o.new_token_ids;
  } else {
    std::string text = d.content;
    if (!c.echo.empty()) {
      text = c.echo + text;
      c.echo.clear();
    }
    const bool ids = plan_.return_token_ids && !o.new_token_ids.empty();
    if (text.empty() && new_lps.empty() && !ids && !o.finished) return;
    c.chars_sent += api::utf8_length(text);
    choice = {{"index", index},
              {"text", text},
              {"logprobs", lps},
              {"finish_reason", reason},
              {"stop_reason", o.finished ? c.stop_reason : json(nullptr)}};
    if (plan_.return_token_ids) {
      choice["token_ids"] = o.new_token_ids;
      if (!c.sent_prompt_ids) choice["prompt_token_ids"] = c.prompt_token_ids;
      c.sent_prompt_ids = true;
    }
  }
  json chunk = chunk_envelope(json::array({choice}));
  if (plan_.continuous_usage) chunk["usage"] = chunk_usage(index);
  send_chunk(chunk);
}

json GenerateSession::chunk_usage(size_t index) const {
  // vLLM: the choice's prompt and its tokens so far. Completion chunks are dumped with unset
  // fields, so their usage keeps "prompt_tokens_details": null; chat chunks drop it.
  const GenerateChoice& c = plan_.choices[index];
  json usage = api::usage_json(c.prompt_tokens, c.completion_tokens);
  if (plan_.chat) usage.erase("prompt_tokens_details");
  return usage;
}

json GenerateSession::total_usage() const {
  int64_t prompt_total = 0, completion_total = 0, cached_total = 0;
  for (size_t i = 0; i < plan_.choices.size(); ++i) {
    const GenerateChoice& c = plan_.choices[i];
    if (i % plan_.n == 0) prompt_total += c.prompt_tokens, cached_total += c.cached_tokens;
    completion_total += c.completion_tokens;
  }
  json usage = api::usage_json(prompt_total, completion_total);
  // vLLM fills the details only under --enable-prompt-tokens-details, and only for a hit.
  if (plan_.prompt_tokens_details && cached_total > 0)
    usage["prompt_tokens_details"] = {{"cached_tokens", cached_total}};
  return usage;
}

void GenerateSession::send_stream_end() {
  if (plan_.include_usage) {
    json usage = total_usage();
    if (usage["prompt_tokens_details"].is_null()) usage.erase("prompt_tokens_details");
    json chunk = chunk_envelope(json::array());
    chunk["usage"] = usage;
    send_chunk(chunk);
  }
  exchange_->send("data: [DONE]\n\n");
  exchange_->end_stream();
  finish_session();
}

void GenerateSession::respond_whole() {
  for (const auto& c : plan_.choices) {
    if (!c.error.empty()) {
      const ErrorKind kind = error_kind(c.error_status);
      HttpResponse r;
      r.status = kind.status;
      r.body = dump(api::ApiError{kind.status, c.error, kind.type}.body());
      exchange_->respond(std::move(r));
      return finish_session();
    }
  }
  json choices = json::array();
  for (size_t i = 0; i < plan_.choices.size(); ++i) {
    const auto& c = plan_.choices[i];
    const char* fr = sched::finish_reason_name(c.finish_reason);
    if (plan_.chat) {
      json tool_calls = json::array();
      if (c.tools) {
        for (const auto& call : c.tools->calls()) tool_calls.push_back(api::tool_call_json(call));
      }
      const bool called = !tool_calls.empty();
      const std::string content = c.echo + c.text;
      json message = {{"role", plan_.chat_role},
                      {"content", called && content.empty() ? json(nullptr) : json(content)},
                      {"refusal", nullptr},
                      {"annotations", nullptr},
                      {"audio", nullptr},
                      {"function_call", nullptr},
                      {"tool_calls", tool_calls}};
      message["reasoning_content"] = c.reasoning ? json(c.reasoning_text) : json(nullptr);
      json reason = fr ? json(fr) : json("stop");
      if (called && c.finish_reason != sched::FinishReason::kAbort) reason = "tool_calls";
      choices.push_back(
          {{"index", i},
           {"message", message},
           {"logprobs", logprobs_json(c.logprobs)},
           {"finish_reason", reason},
           {"stop_reason", c.stop_reason},
           {"token_ids", plan_.return_token_ids ? json(c.token_ids) : json(nullptr)}});
    } else {
      const json prompt_logprobs = plan_.want_prompt_logprobs
                                       ? api::prompt_logprobs_json(c.prompt_logprobs, token_text())
                                       : json(nullptr);
      choices.push_back({{"index", i},
                         {"text", c.echo + c.text},
                         {"logprobs", logprobs_json(c.logprobs)},
                         {"finish_reason", fr ? json(fr) : json(nullptr)},
                         {"stop_reason", c.stop_reason},
                         {"token_ids", plan_.return_token_ids ? json(c.token_ids) : json(nullptr)},
                         {"prompt_logprobs", prompt_logprobs},
                         {"prompt_token_ids",
                          plan_.return_token_ids ? json(c.prompt_token_ids) : json(nullptr)}});
    }
  }
  json out = {{"id", plan_.response_id},
              {"object", plan_.chat ? "chat.completion" : "text_completion"},
              {"created", plan_.created},
              {"model", plan_.model_name},
              {"choices", choices},
              {"service_tier", nullptr},
              {"system_fingerprint", nullptr},
              {"usage", total_usage()},
              {"prompt_logprobs", nullptr},
              {"kv_transfer_params", nullptr}};
  // P's answer to a PD proxy: where D finds the prompt's KV (the first choice's).
  const std::string& handoff = plan_.choices.front().kv_transfer_params;
  if (!handoff.empty()) {
    json params = json::parse(handoff, nullptr, /*allow_exceptions=*/false);
    if (!params.is_discarded()) out["kv_transfer_params"] = std::move(params);
  }
  if (plan_.chat) {  // chat puts the prompt's ids and logprobs at the top level
    out["prompt_token_ids"] =
        plan_.return_token_ids ? json(plan_.choices.front().prompt_token_ids) : json(nullptr);
    if (plan_.want_prompt_logprobs)
      out["prompt_logprobs"] =
          api::prompt_logprobs_json(plan_.choices.front().prompt_logprobs, token_text());
  }
  HttpResponse r;
  r.body = dump(out);
  exchange_->respond(std::move(r));
  finish_session();
}

}  // namespace server
