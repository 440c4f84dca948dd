// Fuzz target: tokenizer.json as a checkpoint ships it (untrusted file). Loading must succeed
// or fail with a Status; a loaded tokenizer must encode and decode a fixed text.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tok = tokenizer::Tokenizer::from_json(std::string(reinterpret_cast<const char*>(data), size),
                                             "tokenizer.json");
  if (!tok.ok()) return 0;
  const auto ids = (*tok)->encode("Hello, world! 你好 12345 <|x|>\n\n  end", true);
  (void)(*tok)->decode(ids);
  return 0;
}
