// GPT-2 byte-level alphabet: each byte maps to one printable Unicode character so that BPE
// vocabularies can be stored as text. Pure functions over static tables; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tokenizer {

// UTF-8 of the characters standing for `bytes`, concatenated.
std::string bytes_to_byte_level(std::string_view bytes);
// Inverse; nullopt when a character is outside the byte-level alphabet.
std::optional<std::string> byte_level_to_bytes(std::string_view text);

}  // namespace tokenizer
