// The byte <-> code point table: printable Latin-1 bytes map to themselves, the other 68 bytes
// to U+0100 and up, in byte order (GPT-2's bytes_to_unicode).
#include "tokenizer/byte_level.h"

#include <array>
#include <unordered_map>

namespace tokenizer {
namespace {

struct Tables {
  std::array<std::string, 256> byte_to_utf8;
  std::unordered_map<uint32_t, uint8_t> code_point_to_byte;
};

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

const Tables& tables() {
  static const Tables t = [] {
    Tables t;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? b : next++;
      append_utf8(cp, &t.byte_to_utf8[b]);
      t.code_point_to_byte[cp] = static_cast<uint8_t>(b);
    }
    return t;
  }();
  return t;
}

}  // namespace

std::string bytes_to_byte_level(std::string_view bytes) {
  const Tables& t = tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += t.byte_to_utf8[b];
  return out;
}

std::optional<std::string> byte_level_to_bytes(std::string_view text) {
  const Tables& t = tables();
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    uint32_t cp;
    int len;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu);
      len = 2;
    } else {
      return std::nullopt;  // the alphabet only uses code points below U+0800
    }
    auto it = t.code_point_to_byte.find(cp);
    if (it == t.code_point_to_byte.end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
    i += len;
  }
  return out;
}

}  // namespace tokenizer
