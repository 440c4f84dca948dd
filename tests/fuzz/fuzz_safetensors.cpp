// Fuzz target: a safetensors file (8-byte header length, JSON header, data). Opening must
// succeed or fail with a Status naming the problem; every tensor it accepts lies in the file.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path =
      "/tmp/chunkpipe_fuzz_" + std::to_string(getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  if (size > 0) std::fwrite(data, 1, size, f);
  std::fclose(f);
  auto file = model::SafetensorsFile::open(path);
  if (file.ok()) {
    for (const auto& [name, info] : (*file)->tensors()) {
      if (info.num_elements() < 0) __builtin_trap();
    }
  }
  return 0;
}
