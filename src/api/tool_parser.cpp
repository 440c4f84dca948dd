// The tool-call state machine. Each state looks for the marker that ends it; text that is
// certainly not (a prefix of) that marker is emitted, the rest stays in pending_.
#include "api/tool_parser.h"

#include <algorithm>

#include "common/text.h"

namespace api {
namespace {

constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kV3ArgsOpen = "```json\n";
constexpr std::string_view kV3ArgsClose = "\n```";

std::string trim(std::string_view s) {  // spaces around a tool name
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

}  // namespace

std::unique_ptr<ToolCallParser> ToolCallParser::create(const std::string& parser_name,
                                                       std::string id_prefix) {
  if (parser_name == "deepseek_v3") {
    return std::unique_ptr<ToolCallParser>(new ToolCallParser(Format::kV3, std::move(id_prefix)));
  }
  if (parser_name == "deepseek_v31") {
    return std::unique_ptr<ToolCallParser>(new ToolCallParser(Format::kV31, std::move(id_prefix)));
  }
  return nullptr;
}

void ToolCallParser::emit_arguments(std::string_view piece, ToolParseDelta* out) {
  if (piece.empty()) return;
  calls_.back().arguments += piece;
  if (!out->calls.empty() && out->calls.back().index == static_cast<int>(calls_.size()) - 1) {
    out->calls.back().arguments += piece;
  } else {
    ToolCallDelta d;
    d.index = static_cast<int>(calls_.size()) - 1;
    d.arguments = std::string(piece);
    out->calls.push_back(std::move(d));
  }
}

bool ToolCallParser::step(ToolParseDelta* out) {
  switch (state_) {
    case State::kContent: {
      const size_t at = pending_.find(kCallsBegin);
      if (at == std::string::npos) {
        const size_t hold = common::partial_marker_suffix(pending_, kCallsBegin);
        out->content += pending_.substr(0, pending_.size() - hold);
        pending_.erase(0, pending_.size() - hold);
        return false;
      }
      out->content += pending_.substr(0, at);
      pending_.erase(0, at + kCallsBegin.size());
      state_ = State::kBetweenCalls;
      return true;
    }
    case State::kBetweenCalls: {
      // The next call or the end of the calls; stray text before it is dropped (as vLLM's
      // parsers do), except a tail that may still grow into one of the two markers.
      const size_t call = pending_.find(kCallBegin), end = pending_.find(kCallsEnd);
      if (call == std::string::npos && end == std::string::npos) {
        const size_t hold = std::max(common::partial_marker_suffix(pending_, kCallBegin),
                                     common::partial_marker_suffix(pending_, kCallsEnd));
        pending_.erase(0, pending_.size() - hold);
        return false;
      }
      if (call < end) {
        pending_.erase(0, call + kCallBegin.size());
        state_ = State::kHeader;
        return true;
      }
      pending_.clear();
      state_ = State::kDone;
      return false;
    }
    case State::kHeader: {
      const size_t sep = pending_.find(kSep);
      if (sep == std::string::npos) return false;
      std::string name;
      size_t consumed;
      if (format_ == Format::kV31) {
        name = trim(std::string_view(pending_).substr(0, sep));
        consumed = sep + kSep.size();
      } else {  // function<sep>NAME\n```json\n
        const size_t open = pending_.find(kV3ArgsOpen, sep + kSep.size());
        if (open == std::string::npos) return false;
        name = trim(std::string_view(pending_).substr(sep + kSep.size(), open - sep - kSep.size()));
        consumed = open + kV3ArgsOpen.size();
      }
      pending_.erase(0, consumed);
      ToolCall call;
      call.id = id_prefix_ + std::to_string(calls_.size());
      call.name = name;
      calls_.push_back(call);
      ToolCallDelta d;
      d.index = static_cast<int>(calls_.size()) - 1;
      d.first = true;
      d.id = call.id;
      d.name = call.name;
      out->calls.push_back(std::move(d));
      state_ = State::kArguments;
      return true;
    }
    case State::kArguments: {
      const std::string end_marker = format_ == Format::kV31
                                         ? std::string(kCallEnd)
                                         : std::string(kV3ArgsClose) + std::string(kCallEnd);
      const size_t at = pending_.find(end_marker);
      if (at == std::string::npos) {
        const size_t hold = common::partial_marker_suffix(pending_, end_marker);
        emit_arguments(std::string_view(pending_).substr(0, pending_.size() - hold), out);
        pending_.erase(0, pending_.size() - hold);
        return false;
      }
      emit_arguments(std::string_view(pending_).substr(0, at), out);
      pending_.erase(0, at + end_marker.size());
      state_ = State::kBetweenCalls;
      return true;
    }
    case State::kDone:
      pending_.clear();  // text after the calls is not part of the reply
      return false;
  }
  return false;
}

ToolParseDelta ToolCallParser::push(std::string_view text) {
  ToolParseDelta out;
  pending_ += text;
  while (step(&out)) {
  }
  return out;
}

ToolParseDelta ToolCallParser::flush() {
  ToolParseDelta out;
  while (step(&out)) {
  }
  if (state_ == State::kContent) {
    out.content += pending_;
  } else if (state_ == State::kArguments) {
    emit_arguments(pending_, &out);  // the output stopped inside a call
  }
  pending_.clear();
  return out;
}

}  // namespace api
