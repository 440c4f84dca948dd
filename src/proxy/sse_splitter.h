// SseSplitter: cuts a byte stream into whole server-sent events (each ends with a blank line,
// "\n\n" or "\r\n\r\n"), however the bytes were split into reads. Plain data.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace proxy {

class SseSplitter {
 public:
  // The events completed by `piece`, each with its terminator.
  std::vector<std::string> push(std::string_view piece) {
    buffer_.append(piece);
    std::vector<std::string> events;
    size_t start = 0;
    while (true) {
      // A terminator can end at most 3 bytes before what was scanned: rescanning only from
      // there keeps a large event that arrives in many small reads linear, not quadratic.
      const size_t from = std::max(start, scanned_ > 3 ? scanned_ - 3 : 0);
      const size_t lf = buffer_.find("\n\n", from);
      const size_t crlf = buffer_.find("\r\n\r\n", from);
      const size_t end = std::min(lf == std::string::npos ? lf : lf + 2,
                                  crlf == std::string::npos ? crlf : crlf + 4);
      if (end == std::string::npos) break;
      events.push_back(buffer_.substr(start, end - start));
      start = end;
      scanned_ = end;
    }
    buffer_.erase(0, start);
    scanned_ = buffer_.size();
    return events;
  }
  // Bytes of an unfinished event.
  const std::string& rest() const { return buffer_; }

 private:
  std::string buffer_;
  size_t scanned_ = 0;  // bytes of buffer_ already searched for a terminator
};

// The payload of an event's `data:` lines (joined by "\n"), or "" when it has none.
inline std::string sse_data(const std::string& event) {
  std::string data;
  size_t pos = 0;
  while (pos < event.size()) {
    size_t eol = event.find('\n', pos);
    if (eol == std::string::npos) eol = event.size();
    std::string_view line(event.data() + pos, eol - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.substr(0, 5) == "data:") {
      line.remove_prefix(5);
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      if (!data.empty()) data += '\n';
      data.append(line);
    }
    pos = eol + 1;
  }
  return data;
}

}  // namespace proxy
