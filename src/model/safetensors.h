// Safetensors reading: SafetensorsFile maps one file read-only and indexes its header;
// Checkpoint resolves tensor names across a model directory (single file, or shards listed in
// model.safetensors.index.json). Immutable after open; safe to read from many threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "tensor/dtype.h"

namespace model {

struct TensorInfo {
  std::string name;
  tensor::DType dtype = tensor::DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into the mapping
  size_t size_bytes = 0;
  std::string file;  // path, for error messages
  int64_t num_elements() const;
  std::string shape_string() const;
};

// Drops the process's mapped pages of `t` (they stay in the page cache, and a later read maps
// them again): a loader that has copied a tensor calls it, so that the checkpoint's pages do
// not count twice in the resident memory while the rest loads.
void release_pages(const TensorInfo& t);

class SafetensorsFile {
 public:
  // Maps `path` and validates the header: length, JSON, dtypes, offsets, sizes.
  static common::Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
};

class Checkpoint {
 public:
  static common::Result<std::unique_ptr<Checkpoint>> open(const std::string& model_dir);

  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // The tensor, or NotFound naming the index (or file) and the tensor.
  common::Result<const TensorInfo*> find(const std::string& name) const;
  std::vector<std::string> tensor_names() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::string catalog_;  // the file that lists the tensors (index.json or the single file)
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> index_;
};

}  // namespace model
