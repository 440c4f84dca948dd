// quant_model_description.json, the tensor -> quantization-type map that msmodelslim writes
// beside a W8A8 checkpoint (vllm-ascend's `--quantization ascend`, w8a8-mtp.md 1a-1d).
// Parsed once at load; immutable after; thread-safe to share.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "common/status.h"

namespace model {

inline constexpr char kQuantDescriptionFile[] = "quant_model_description.json";

// The per-tensor types chunkpipe loads; anything else is refused when a loaded tensor has it.
enum class QuantType { kFloat, kW8A8, kW8A8Dynamic, kW8A8Mix, kW4A8Dynamic };

struct QuantDescription {
  std::string path;              // for error messages
  std::string model_quant_type;  // e.g. "W8A8_DYNAMIC"
  bool is_rot_used = false;      // a top-level rot.weight rotates the MTP layer's hidden input
  std::map<std::string, std::string> types;  // tensor name -> type (string values only)

  // The type of `tensor` ("...weight"): kFloat when listed FLOAT, an error naming the tensor
  // and the file when it is missing or of a type chunkpipe does not load.
  common::Result<QuantType> type_of(const std::string& tensor) const;
};

// Parses the JSON text; `path` names it in errors. Values that are not strings are ignored, as
// upstream does; a quantized KV cache or attention (kv_cache_type, fa_quant_type) is refused.
common::Result<QuantDescription> parse_quant_description(const std::string& text,
                                                         const std::string& path);

// The description in `model_dir`, nullopt when the file is absent.
common::Result<std::optional<QuantDescription>> load_quant_description(
    const std::string& model_dir);

}  // namespace model
