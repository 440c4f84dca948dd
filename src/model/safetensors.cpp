// Safetensors: 8-byte little-endian header length N, N bytes of JSON, then the data buffer
// with offsets relative to its start. Files are mmapped; nothing is copied here.
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace model {
namespace {

using common::Result;
using common::Status;
using nlohmann::json;

std::string basename(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

}  // namespace

int64_t TensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  const std::string name = basename(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return common::not_found(name + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return common::data_loss(name + ": cannot stat");
  }
  const size_t file_size = static_cast<size_t>(st.st_size);
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  if (file_size > 0) {
    void* m = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      return common::data_loss(name + ": mmap failed (" + std::strerror(errno) + ")");
    }
    f->mapping_ = m;
    f->mapping_size_ = file_size;
  }
  ::close(fd);
  if (file_size < 8) {
    return common::data_loss(name + ": truncated safetensors header (file has " +
                             std::to_string(file_size) + " bytes, needs at least 8)");
  }
  const auto* bytes = static_cast<const uint8_t*>(f->mapping_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > file_size - 8) {
    return common::data_loss(name + ": truncated safetensors header (header says " +
                             std::to_string(header_len) + " bytes, file has " +
                             std::to_string(file_size - 8) + " after the length)");
  }
  json header = json::parse(bytes + 8, bytes + 8 + header_len, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return common::data_loss(name + ": safetensors header is not a JSON object");
  }
  const uint8_t* data_start = bytes + 8 + header_len;
  const size_t data_size = file_size - 8 - header_len;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string where = name + ": tensor '" + it.key() + "'";
    const json& e = it.value();
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() || !e.contains("shape") ||
        !e["shape"].is_array() || !e.contains("data_offsets") || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2) {
      return common::data_loss(where + " has a malformed header entry");
    }
    TensorInfo t;
    t.name = it.key();
    t.file = path;
    const std::string dtype = e["dtype"].get<std::string>();
    auto parsed = tensor::dtype_from_safetensors(dtype);
    if (!parsed)
      return common::data_loss(where + " has unknown or unsupported dtype '" + dtype + "'");
    t.dtype = *parsed;
    for (const json& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return common::data_loss(where + " has an invalid shape " +
                                 e["shape"].dump(-1, ' ', false, json::error_handler_t::replace));
      }
      t.shape.push_back(d.get<int64_t>());
    }
    const json& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return common::data_loss(where + " has invalid data_offsets " +
                               off.dump(-1, ' ', false, json::error_handler_t::replace));
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return common::data_loss(where + " data [" + std::to_string(begin) + ", " +
                               std::to_string(end) + ") lies beyond the file's " +
                               std::to_string(data_size) + " data bytes (truncated file?)");
    }
    const uint64_t expected = static_cast<uint64_t>(t.num_elements()) *
                              static_cast<uint64_t>(tensor::dtype_size_bytes(t.dtype));
    if (end - begin != expected) {
      return common::data_loss(where + " holds " + std::to_string(end - begin) +
                               " bytes but shape " + t.shape_string() + " of " + dtype + " needs " +
                               std::to_string(expected));
    }
    t.data = data_start + begin;
    t.size_bytes = end - begin;
    f->tensors_.emplace(t.name, std::move(t));
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_size_);
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = model_dir;
  // Hugging Face's index, or another writer's (msmodelslim: quant_model_weights.*.index.json).
  fs::path index_path = fs::path(model_dir) / "model.safetensors.index.json";
  if (!fs::exists(index_path) && fs::is_directory(model_dir)) {
    std::vector<fs::path> indexes;
    for (const auto& entry : fs::directory_iterator(model_dir)) {
      const std::string n = entry.path().filename().string();
      const std::string suffix = ".safetensors.index.json";
      if (n.size() > suffix.size() &&
          n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
        indexes.push_back(entry.path());
    }
    std::sort(indexes.begin(), indexes.end());
    if (!indexes.empty()) index_path = indexes.front();
  }
  std::vector<std::string> shard_files;
  std::map<std::string, std::string> weight_map;  // tensor -> shard
  if (fs::exists(index_path)) {
    ck->catalog_ = index_path.filename().string();
    std::ifstream in(index_path);
    std::stringstream ss;
    ss << in.rdbuf();
    json index = json::parse(ss.str(), nullptr, false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return common::data_loss(ck->catalog_ + ": not valid JSON with a \"weight_map\" object");
    }
    std::set<std::string> seen;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return common::data_loss(ck->catalog_ + ": weight_map entry for tensor '" + it.key() +
                                 "' is not a file name");
      }
      const std::string shard = it.value().get<std::string>();
      weight_map[it.key()] = shard;
      if (seen.insert(shard).second) {
        if (!fs::exists(fs::path(model_dir) / shard)) {
          return common::not_found(ck->catalog_ + ": shard '" + shard + "' (holding tensor '" +
                                   it.key() + "') is missing from " + model_dir);
        }
        shard_files.push_back(shard);
      }
    }
  } else {
    for (const auto& entry : fs::directory_iterator(model_dir)) {
      if (entry.path().extension() == ".safetensors") {
        shard_files.push_back(entry.path().filename().string());
      }
    }
    std::sort(shard_files.begin(), shard_files.end());
    if (shard_files.empty()) {
      return common::not_found(model_dir +
                               ": no model.safetensors.index.json and no *.safetensors files");
    }
    ck->catalog_ = shard_files.size() == 1 ? shard_files[0] : model_dir + "/*.safetensors";
  }
  for (const std::string& shard : shard_files) {
    CP_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open((fs::path(model_dir) / shard).string()));
    for (const auto& [name, info] : file->tensors()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(name);
        if (it == weight_map.end() || it->second != shard) continue;  // not this shard's tensor
      }
      ck->index_[name] = &info;
    }
    ck->files_.push_back(std::move(file));
  }
  for (const auto& [name, shard] : weight_map) {
    if (!ck->index_.count(name)) {
      return common::data_loss(ck->catalog_ + ": tensor '" + name + "' is listed in shard '" +
                               shard + "' but that file does not contain it");
    }
  }
  return ck;
}

Result<const TensorInfo*> Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return common::not_found(catalog_ + ": tensor '" + name + "' is missing from the checkpoint");
  }
  return it->second;
}

void release_pages(const TensorInfo& t) {
  // Whole pages inside the tensor only: a page it shares with a neighbour stays.
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (uintptr_t(t.data) + page - 1) / page * page;
  const uintptr_t end = (uintptr_t(t.data) + t.size_bytes) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, info] : index_) names.push_back(name);
  return names;
}

}  // namespace model
