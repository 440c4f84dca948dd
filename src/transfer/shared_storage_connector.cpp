// Shared-storage KV connector: keys, files, and the two sides.
#include "transfer/shared_storage_connector.h"

#include <xxhash.h>

#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/logging.h"
#include "dist/wire.h"

namespace transfer {
namespace {

constexpr uint32_t kMagic = 0x564b5043;  // "CPKV"
constexpr uint32_t kVersion = 1;

struct FileHeader {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  int64_t num_tokens = 0;
  int64_t row_dim = 0;
};

// The files' name: a hash of the stored tokens, seeded by the request's cache_salt (0 without
// one, which is the unseeded hash), so a salted prompt's KV is found only under its own salt.
std::string key_of(const std::vector<int32_t>& ids, int64_t n, const std::string& cache_salt) {
  const XXH64_hash_t seed =
      cache_salt.empty() ? 0 : XXH3_64bits(cache_salt.data(), cache_salt.size());
  const XXH128_hash_t h =
      XXH3_128bits_withSeed(ids.data(), static_cast<size_t>(n) * sizeof(int32_t), seed);
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return hex;
}

int64_t expected_size(int64_t num_tokens, int64_t row_dim) {
  return static_cast<int64_t>(sizeof(FileHeader)) +
         num_tokens * row_dim * static_cast<int64_t>(sizeof(float));
}

}  // namespace

std::string layer_file(const std::string& path, const std::string& key, int layer) {
  return path + "/" + key + "/layer_" + std::to_string(layer) + ".kv";
}

std::vector<uint8_t> encode_transfers(const std::vector<StorageTransfer>& transfers) {
  std::vector<uint8_t> out;
  dist::WireWriter w(&out);
  w.put<uint64_t>(transfers.size());
  for (const auto& t : transfers) {
    w.put_string(t.req_id);
    w.put_string(t.key);
    w.put(t.num_tokens);
    w.put_vector(t.block_ids);
    w.put<uint8_t>(t.save ? 1 : 0);
  }
  return out;
}

common::Result<std::vector<StorageTransfer>> decode_transfers(const std::vector<uint8_t>& bytes) {
  std::vector<StorageTransfer> out;
  if (bytes.empty()) return out;
  dist::WireReader r(bytes);
  uint64_t n = 0;
  if (!r.get(&n) || n > bytes.size()) return common::data_loss("malformed KV connector metadata");
  out.resize(n);
  for (auto& t : out) {
    uint8_t save = 0;
    r.get_string(&t.req_id);
    r.get_string(&t.key);
    r.get(&t.num_tokens);
    r.get_vector(&t.block_ids);
    r.get(&save);
    t.save = save != 0;
  }
  if (!r.ok() || !r.at_end()) return common::data_loss("malformed KV connector metadata");
  return out;
}

SharedStorageScheduler::Tracked& SharedStorageScheduler::track(const sched::Request& r) {
  auto it = requests_.find(r.request_id);
  if (it != requests_.end()) return it->second;
  Tracked t;
  // Whole blocks before the last prompt token, which is always computed (it yields the output).
  t.num_tokens = (r.num_prompt_tokens() - 1) / o_.block_size * o_.block_size;
  if (t.num_tokens > 0) t.key = key_of(r.prompt_token_ids, t.num_tokens, r.cache_salt);
  return requests_.emplace(r.request_id, std::move(t)).first->second;
}

bool SharedStorageScheduler::on_disk(const Tracked& t) const {
  std::error_code ec;
  for (int l = 0; l < o_.num_layers; ++l) {
    const auto size = std::filesystem::file_size(layer_file(o_.path, t.key, l), ec);
    if (ec || static_cast<int64_t>(size) != expected_size(t.num_tokens, o_.row_dim)) return false;
  }
  return true;
}

std::optional<sched::MatchedTokens> SharedStorageScheduler::get_num_new_matched_tokens(
    const sched::Request& request, int64_t num_computed_tokens) {
  Tracked& t = track(request);
  sched::MatchedTokens m;
  if (t.num_tokens <= num_computed_tokens || !on_disk(t)) return m;
  t.stored = true;
  m.num_tokens = t.num_tokens - num_computed_tokens;
  return m;
}

void SharedStorageScheduler::update_state_after_alloc(const sched::Request& request,
                                                      const std::vector<kv::BlockId>&,
                                                      int64_t num_external_tokens) {
  track(request).load = num_external_tokens > 0;
}

std::vector<uint8_t> SharedStorageScheduler::build_connector_meta(
    const sched::SchedulerOutput& output, const kv::KvCacheManager& kv) {
  std::vector<StorageTransfer> transfers;
  for (const auto& s : output.scheduled) {
    auto it = requests_.find(s.req_id);
    if (it == requests_.end() || it->second.num_tokens == 0) continue;
    Tracked& t = it->second;
    const auto& table = kv.block_table(s.req_id);
    const size_t blocks = static_cast<size_t>(t.num_tokens / o_.block_size);
    if (table.size() < blocks) continue;
    StorageTransfer x{
        s.req_id, t.key, t.num_tokens, {table.begin(), table.begin() + blocks}, false};
    if (t.load) {  // the first step after allocation loads, before the forward
      t.load = false;
      transfers.push_back(std::move(x));
    } else if (!t.stored && s.num_computed_tokens + s.num_scheduled_tokens >= t.num_tokens) {
      // This step computes the last of the stored blocks: save them as each layer finishes.
      t.stored = true;
      if (on_disk(t)) continue;  // another request saved the same prompt meanwhile
      x.save = true;
      transfers.push_back(std::move(x));
    }
  }
  return transfers.empty() ? std::vector<uint8_t>{} : encode_transfers(transfers);
}

sched::FinishedHandoff SharedStorageScheduler::request_finished(const sched::Request& request,
                                                                const std::vector<kv::BlockId>&) {
  requests_.erase(request.request_id);
  return {};
}

void SharedStorageWorker::register_kv_cache(model::LatentKvCache* cache, int layer_begin,
                                            int layer_end) {
  cache_ = cache;
  layer_begin_ = layer_begin;
  layer_end_ = layer_end;
}

common::Status SharedStorageWorker::start_load_kv(const std::vector<uint8_t>& metadata) {
  saves_.clear();
  CP_ASSIGN_OR_RETURN(std::vector<StorageTransfer> transfers, decode_transfers(metadata));
  const int bs = cache_->block_size();
  const int64_t dim = cache_->row_dim();
  for (StorageTransfer& t : transfers) {
    if (static_cast<int64_t>(t.block_ids.size()) * bs < t.num_tokens)
      return common::data_loss("KV connector metadata: too few blocks for " + t.req_id);
    for (int32_t b : t.block_ids) {
      if (b < 0 || b >= cache_->num_blocks())
        return common::data_loss("KV connector metadata: block " + std::to_string(b));
    }
    if (t.save) {
      saves_.push_back(std::move(t));
      continue;
    }
    std::vector<float> rows;
    for (int l = layer_begin_; l < layer_end_; ++l) {
      const std::string file = layer_file(o_.path, t.key, l);
      FILE* f = std::fopen(file.c_str(), "rb");
      FileHeader h;
      const bool ok = f != nullptr && std::fread(&h, sizeof(h), 1, f) == 1 && h.magic == kMagic &&
                      h.version == kVersion && h.num_tokens == t.num_tokens && h.row_dim == dim &&
                      (rows.resize(static_cast<size_t>(t.num_tokens * dim)),
                       std::fread(rows.data(), sizeof(float), rows.size(), f) == rows.size());
      if (f != nullptr) std::fclose(f);
      if (!ok) return common::data_loss("SharedStorageConnector: cannot load " + file);
      for (int64_t i = 0; i < t.num_tokens; ++i) {
        const int64_t slot = int64_t(t.block_ids[size_t(i / bs)]) * bs + i % bs;
        cache_->write_row(l, slot, rows.data() + i * dim);
      }
    }
  }
  return {};
}

common::Status SharedStorageWorker::save_kv_layer(int layer) {
  const int bs = cache_->block_size();
  const int64_t dim = cache_->row_dim();
  for (const StorageTransfer& t : saves_) {
    const std::string file = layer_file(o_.path, t.key, layer);
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(file).parent_path(), ec);
    const std::string tmp = file + ".tmp." + std::to_string(getpid());
    FILE* f = std::fopen(tmp.c_str(), "wb");
    FileHeader h;
    h.num_tokens = t.num_tokens;
    h.row_dim = dim;
    bool ok = f != nullptr && std::fwrite(&h, sizeof(h), 1, f) == 1;
    std::vector<float> row(static_cast<size_t>(dim));  // files hold f32 rows whatever the cache
    for (int64_t i = 0; ok && i < t.num_tokens; ++i) {
      const int64_t slot = int64_t(t.block_ids[size_t(i / bs)]) * bs + i % bs;
      cache_->read_row(layer, slot, row.data());
      ok = std::fwrite(row.data(), sizeof(float), size_t(dim), f) == size_t(dim);
    }
    if (f != nullptr) ok = std::fclose(f) == 0 && ok;
    if (ok) ok = std::rename(tmp.c_str(), file.c_str()) == 0;
    if (!ok) {  // a failed save costs a later recompute, nothing else
      std::remove(tmp.c_str());
      LOG(WARNING) << "SharedStorageConnector: cannot save " << file << ": "
                   << std::strerror(errno);
    }
  }
  return {};
}

}  // namespace transfer
